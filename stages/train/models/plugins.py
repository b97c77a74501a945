"""Plug-in models and losses: ``model`` and ``loss`` are a built-in name or an import path ``package.module:name``.

Where a plug-in is found: the Python path of the process that runs gnnpipe (``PYTHONPATH``, installed packages),
plus the directory gnnpipe is run from and the gnnpipe checkout (``examples.custom_model:build``). The ranks run
from the checkout; the stage hands them the same path (``rank_pythonpath``), so what validates here imports there.

The plug-in's code is part of the train artifact's key (``stages.train.models.plugin_code``).

Torch-free at import: ``Params`` validates with ``check_ref`` in milliseconds (the module is found and its source
read for the name, not imported).
"""

from __future__ import annotations

import importlib
import importlib.util
import inspect
import os
import re
import sys
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from stages.choices import DECODERS, LOSSES, MODELS
from stages.train.models.plugin_names import Lookup, defined_names, look_up
from storage.errors import InputError

if TYPE_CHECKING:
    import torch

    from storage.schema import GraphSchema

IMPORT_PATH = re.compile(r"^[A-Za-z_]\w*(\.[A-Za-z_]\w*)*:[A-Za-z_]\w*$")
REPO = Path(__file__).resolve().parents[2]


def is_import_path(value: str) -> bool:
    return bool(IMPORT_PATH.match(value))


def _on_path() -> None:
    """Plug-ins are also looked up in the current directory and the checkout (appended: never shadowing an installed
    package)."""
    for directory in (os.getcwd(), str(REPO)):
        if directory not in sys.path:
            sys.path.append(directory)


def rank_pythonpath() -> str:
    """``PYTHONPATH`` for the ranks (which run from the checkout): this process's, made absolute, and its cwd."""
    entries = [os.getcwd(), *(p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p)]
    return os.pathsep.join(dict.fromkeys(os.path.abspath(p) for p in entries))


def module_origin(module: str) -> Path | None:
    """The file ``module`` would load from, without importing it (its parent packages' ``__init__`` do run)."""
    _on_path()
    try:
        spec = importlib.util.find_spec(module)
    except ModuleNotFoundError:
        return None
    except Exception as err:  # noqa: BLE001 - a parent package's __init__ is the user's code: say what it raised
        raise ValueError(f"importing the package of {module} failed: {type(err).__name__}: {err}") from None
    if spec is None or spec.origin is None or not Path(spec.origin).is_file():
        return None
    return Path(spec.origin)


def check_ref(value: str, builtins: Sequence[str], what: str) -> str:
    """``value`` if it is a built-in name or an import path whose module is found and defines a callable of that
    name; else ValueError (one line, which the Params turn into ``invalid parameter ...``). The module is read, not
    imported, where its source says enough (``stages.train.models.plugin_names``)."""
    if value in builtins:
        return value
    if not is_import_path(value):
        raise ValueError(f"unknown {what}")
    module, _, attr = value.partition(":")
    origin = module_origin(module)
    if origin is None:
        raise ValueError(f"module {module} not found on the Python path, in the current directory or in the "
                         f"gnnpipe checkout (set PYTHONPATH, or run gnnpipe from the directory that holds it)")
    try:
        found = look_up(origin, attr)
    except (SyntaxError, UnicodeDecodeError) as err:   # importing it would fail the same way, later
        raise ValueError(f"module {module} ({origin}) does not parse: {err}") from None
    if found is Lookup.UNKNOWN:   # the source cannot tell: import it after all (seconds, the user's code runs)
        found = Lookup.CALLABLE if callable(_import(value)) else Lookup.NOT_CALLABLE
    if found is Lookup.MISSING:
        defined = defined_names(origin)
        listed = f" defines {', '.join(defined[:8])}{', ...' if len(defined) > 8 else ''}" if defined else ""
        raise ValueError(f"module {module} has no attribute {attr!r} ({origin}{listed})")
    if found is Lookup.NOT_CALLABLE:
        raise ValueError(f"{module}:{attr} is not callable: a {what} is a function or a class")
    return value


def load(ref: str, what: str) -> Any:
    """The object import path ``ref`` names; a failing import is one InputError line."""
    try:
        return _import(ref)
    except ValueError as err:
        raise InputError(f"{what} {ref}: {err}") from None


def _import(ref: str) -> Any:
    """The object ``ref`` names, importing its module; ValueError saying what failed."""
    module_name, _, attr = ref.partition(":")
    _on_path()
    try:
        module = importlib.import_module(module_name)
    except Exception as err:  # noqa: BLE001 - the user's module: whatever it raises, say it on one line
        raise ValueError(f"importing {module_name} failed: {type(err).__name__}: {err}") from None
    if not hasattr(module, attr):
        raise ValueError(f"module {module_name} has no attribute {attr!r} ({module.__file__})")
    return getattr(module, attr)


def resolve_model(ref: str, typed: bool) -> str:
    """``auto`` as the built-in it stands for on this graph (``stages.choices``); any other name as it is."""
    if ref != "auto":
        return ref
    return "rgcn" if typed else "sage"


EDGE_AWARE_BUILTINS = ("gat",)   # built-ins that take edge features (GATConv's edge_dim: in the attention scores)


def edge_dim_for(ref: str, num_edge_features: int, enabled: bool = True) -> int:
    """The edge feature width model ``ref`` (resolved) gets, 0 for none: the graph's D when ``enabled`` and the model
    takes edge features: gat, or a plug-in factory that declares an ``edge_dim`` parameter; other built-ins ignore
    them. A model with edge_dim > 0 runs on batches that carry ``edge_attr``."""
    if not enabled or not num_edge_features:
        return 0
    if ref in MODELS:
        return num_edge_features if ref in EDGE_AWARE_BUILTINS else 0
    return num_edge_features if takes_parameter(load(ref, "model"), "edge_dim") else 0


def make_model(ref: str, model_kwargs: Mapping[str, Any], *, in_channels: int | Mapping[str, int | None],
               hidden: int, out_channels: int, num_layers: int, dropout: float, heads: int,
               schema: GraphSchema | None = None, edge_dim: int = 0) -> torch.nn.Module:
    """A built-in model, or what the factory ``ref`` returns for the derived sizes plus ``model_kwargs``.

    On a typed graph ``in_channels`` maps each node type to its feature width (None: a learnt embedding): the model
    is ``stages.train.models.typed_model.HeteroModel``, a typed input to ``hidden`` channels and, as its body, the
    built-in or the plug-in built for ``in_channels=hidden`` (built-ins also get the graph's ``schema``; a plug-in
    that declares ``metadata`` gets PyG's ``(node types, edge types)`` and runs on per-type dicts, ``HeteroBody``).

    ``edge_dim`` (``edge_dim_for``): gat gets it (when > 0); a plug-in that declares ``edge_dim`` always does (0: no
    edge features, then it is called without ``edge_attr``), and is called ``model(x, edge_index,
    edge_attr=...)`` on batches that carry them."""
    import torch

    from stages.train.models.model import build_model

    typed = not isinstance(in_channels, int)
    ref = resolve_model(ref, typed)
    sizes: dict[str, Any] = {"in_channels": hidden if typed else in_channels, "hidden": hidden,
                             "out_channels": out_channels, "num_layers": num_layers, "dropout": dropout}
    typed_plugin = False
    if ref in MODELS:
        edges = {"edge_dim": edge_dim} if edge_dim else {}
        model = build_model(ref, **sizes, heads=heads, schema=schema, **edges, **model_kwargs)
    else:
        factory = load(ref, "model")
        typed_plugin = takes_metadata(factory)
        if takes_parameter(factory, "edge_dim"):
            sizes["edge_dim"] = edge_dim
        if typed_plugin:
            if not typed or schema is None:
                raise InputError(f"model {ref} takes metadata (a typed plug-in, HeteroData dicts): it needs a typed "
                                 f"graph; on this one give a factory without a metadata parameter")
            sizes["metadata"] = ([t.name for t in schema.node_types], [e.as_tuple() for e in schema.edge_types])
        try:
            model = factory(**sizes, **model_kwargs)
        except TypeError as err:   # most often a size or a model_kwargs entry the factory does not take
            raise InputError(f"model {ref}: calling it with {', '.join([*sizes, *model_kwargs])} failed: {err} "
                             f"(a factory takes the sizes as keywords, plus model_kwargs)") from None
    if not isinstance(model, torch.nn.Module):
        raise InputError(f"model {ref} returned a {type(model).__name__}, not a torch.nn.Module")
    if typed:
        from stages.train.models.typed_model import HeteroBody, HeteroModel, TypedInput

        assert not isinstance(in_channels, int)
        if typed_plugin:
            assert schema is not None
            model = HeteroBody(model, sizes["metadata"][0], sizes["metadata"][1])
        return HeteroModel(TypedInput(in_channels, hidden), model)
    return model


def takes_metadata(factory: Callable[..., Any]) -> bool:
    """Whether a plug-in factory declares a ``metadata`` parameter: a typed plug-in (``examples/hetero_model.py``)."""
    return takes_parameter(factory, "metadata")


def takes_parameter(factory: Callable[..., Any], name: str) -> bool:
    """Whether a plug-in factory declares parameter ``name`` (``metadata``: typed; ``edge_dim``: edge-aware)."""
    try:
        return name in inspect.signature(factory).parameters
    except (TypeError, ValueError):   # no signature to read (a builtin): a plain factory
        return False


def make_loss(ref: str) -> Callable[[Any, Any], Any]:
    """The loss function named by ``ref`` (a resolved name: ``Params.resolved_loss``): ``(logits, y) -> 0-d
    tensor`` for node classification, ``(positive scores, negative scores) -> 0-d tensor`` for link prediction."""
    import torch.nn.functional as F

    from stages.train.tasks.link_decoders import link_loss

    if ref in LOSSES:
        builtins: dict[str, Callable[[Any, Any], Any]] = {"cross_entropy": F.cross_entropy, "bce": link_loss}
        return builtins[ref]
    fn = load(ref, "loss")
    if not callable(fn):
        raise InputError(f"loss {ref} is a {type(fn).__name__}, not a function (scores, targets) -> tensor")
    return fn


def make_decoder(ref: str, channels: int, dropout: float) -> torch.nn.Module:
    """Link prediction's pair scorer: a built-in (``stages.train.tasks.link_decoders``) or what the factory ``ref``
    returns for ``channels`` (the embeddings' width): a module ``(h_src [.., D], h_dst [.., D]) -> scores [..]``."""
    import torch

    from stages.train.tasks.link_decoders import DotDecoder, MLPDecoder

    if ref in DECODERS:
        return DotDecoder() if ref == "dot" else MLPDecoder(channels, dropout=dropout)
    factory = load(ref, "decoder")
    try:
        decoder = factory(channels=channels)
    except TypeError as err:
        raise InputError(f"decoder {ref}: calling it with channels failed: {err} (a decoder factory takes "
                         f"channels=<embedding width> as a keyword)") from None
    if not isinstance(decoder, torch.nn.Module):
        raise InputError(f"decoder {ref} returned a {type(decoder).__name__}, not a torch.nn.Module")
    return decoder
