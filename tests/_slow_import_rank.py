"""A rank module whose import takes a minute, for ``tests/test_local_agent.py``: the forking agent imports it
before it forks, and a stop signal must end that import."""

import time

time.sleep(60)

if __name__ == "__main__":
    raise SystemExit("never reached: the agent is stopped while it imports this module")
