#!/usr/bin/env bash
# A products-scale 1-GPU epoch (the train stage's defaults) of this tree beside an older one, on the same machine and
# artifacts, then the CUDA tests of the files named. Made for one `run` of the device tool:
#
#   git archive <old-rev> -o old_tree.tar           # here, beforehand (old_tree.tar is in .git/info/exclude)
#   make gpu-wheels                                  # the GPU machine's missing wheels into .whl/
#   run: bash benchmarks/gpu_side_by_side.sh [tests/test_x.py ...]     carry: .whl, old_tree.tar
#
# Results go to $OUT/side_by_side.tgz: new.json (profiled: --profile 10), step.json (this tree with --cuda-graph
# step: the step graphed), graph.json (--cuda-graph auto: the sampling too, profiled), tf32.json (auto with TF32
# GEMMs: --matmul-precision high), old.json, tests.log, times.txt. The first run builds the artifacts (~90 s on
# an H200); each later one loads them (~30 s) and times 30 batches; the whole fits one 600 s device call.
# benchmarks/RESULTS.md "[4/5] One H200, before and after" ran it (as gpu_run.sh) at 92e8d44 against d545000.
# Each tree times with its own bench_train: before 6aa1592 that left the loss guard out of the timed pass (its
# 2 reads a batch); from then on it times Trainer.run_batches, the stage's own pass, guard included.
set -u
export PYTHONUNBUFFERED=1
R=$PWD; G=/tmp/side_by_side; SITE=/tmp/site; OLD=/tmp/old
mkdir -p "$G" "$SITE" "$OLD"
t0=$(date +%s)
python3 -m pip install -q --no-index --no-deps --no-compile --target "$SITE" .whl/*.whl > "$G/pip.log" 2>&1
tar xf old_tree.tar -C "$OLD"
ART=$R/benchmarks/work/gpu/artifacts-products
B=(benchmarks/bench_train.py --nodes 2400000 --avg-degree 50 --features 100 --classes 47 --parts 1 --device cuda
   --skip-single --max-batches 30 --feature-dtype float32 --root "$ART" --policies runtime)
nvidia-smi --query-gpu=name,memory.total --format=csv > "$G/smi.txt"
echo "new start $(( $(date +%s) - t0 ))" >> "$G/times.txt"
PYTHONPATH=$SITE:$R timeout 160 python3 "${B[@]}" --profile 10 > "$G/new.json" 2> "$G/new.err"
echo "step start $(( $(date +%s) - t0 ))" >> "$G/times.txt"
PYTHONPATH=$SITE:$R timeout 60 python3 "${B[@]}" --cuda-graph step > "$G/step.json" 2> "$G/step.err"
echo "graph start $(( $(date +%s) - t0 ))" >> "$G/times.txt"
PYTHONPATH=$SITE:$R timeout 75 python3 "${B[@]}" --profile 10 --cuda-graph auto > "$G/graph.json" 2> "$G/graph.err"
echo "tf32 start $(( $(date +%s) - t0 ))" >> "$G/times.txt"
PYTHONPATH=$SITE:$R timeout 60 python3 "${B[@]}" --cuda-graph auto --matmul-precision high > "$G/tf32.json" \
    2> "$G/tf32.err"
echo "old start $(( $(date +%s) - t0 ))" >> "$G/times.txt"
(cd "$OLD" && PYTHONPATH=$SITE:$OLD timeout 55 python3 "${B[@]}" > "$G/old.json" 2> "$G/old.err")
if [ $# -gt 0 ]; then
    echo "tests start $(( $(date +%s) - t0 ))" >> "$G/times.txt"
    PYTHONPATH=$SITE:$R timeout 110 python3 -m pytest -q -rA -m cuda -p no:cacheprovider "$@" > "$G/tests.log" 2>&1
fi
echo "end $(( $(date +%s) - t0 )) load $(cat /proc/loadavg)" >> "$G/times.txt"
tar czf "$OUT/side_by_side.tgz" -C /tmp side_by_side
cat "$G/times.txt"; tail -n 3 "$G/tests.log" 2>/dev/null
