"""The model contract: ``BlockModel`` names the flags ``capabilities`` reads (no more, no fewer), a plug-in's
declared flags are read back and a model that declares none gets the defaults; the built-ins declare every flag;
the encoder builder the trainer and inference share."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from torch_geometric.nn.models import GraphSAGE

from stages.train.models.encoder import build_encoder
from stages.train.models.model import MODELS, build_model, is_block_model, needs_degrees
from stages.train.models.model_contract import BlockModel, ModelCaps, capabilities
from stages.train.models.typed_model import HeteroBody, HeteroModel, TypedInput
from stages.train.params import Params
from storage.schema import GraphSchema

pytestmark = pytest.mark.usefixtures("one_torch_thread")
SIZES = {"in_channels": 5, "hidden": 8, "out_channels": 3, "num_layers": 2, "dropout": 0.0}
FLAGS = {f.name for f in dataclasses.fields(ModelCaps)}


class DeclaresAll(torch.nn.Module):
    """A plug-in declaring every flag, one of them as a property."""

    supports_blocks = True
    needs_degrees = True
    supports_offset_targets = False
    num_layers = 2

    @property
    def needs_node_types(self) -> bool:
        return True


def test_the_protocol_names_exactly_the_flags_the_helper_reads():
    members = {name for name, value in vars(BlockModel).items() if isinstance(value, property)}
    assert members == FLAGS
    for name in members:   # each flag says what it means
        assert (getattr(BlockModel, name).__doc__ or "").strip(), name


def test_a_plugin_declaring_flags_is_read_back():
    model = DeclaresAll()
    assert isinstance(model, BlockModel)
    assert capabilities(model) == ModelCaps(supports_blocks=True, needs_degrees=True, supports_offset_targets=False,
                                            needs_node_types=True)
    assert is_block_model(model) and needs_degrees(model)
    model.supports_blocks = False   # type: ignore[misc]   # an instance's own value wins, read on each call
    assert not capabilities(model).supports_blocks and not needs_degrees(model)


def test_a_model_declaring_none_gets_the_defaults():
    plain = GraphSAGE(5, 8, 2, 3)
    assert not isinstance(plain, BlockModel)
    assert capabilities(plain) == ModelCaps()
    assert all(getattr(ModelCaps(), flag) is False for flag in FLAGS)
    assert not is_block_model(plain) and not needs_degrees(plain)


@pytest.mark.parametrize("kind", MODELS)
def test_every_builtin_declares_every_flag(kind: str):
    model = build_model(kind, **SIZES)
    assert isinstance(model, BlockModel)
    assert capabilities(model) == ModelCaps(**{flag: bool(getattr(model, flag)) for flag in FLAGS})


def test_the_typed_wrappers_declare_every_flag_and_follow_their_body():
    body = build_model("gcn", **{**SIZES, "in_channels": 8})
    model = HeteroModel(TypedInput({"a": 4, "b": None}, 8), body)
    assert isinstance(model, BlockModel)
    assert capabilities(model) == ModelCaps(supports_blocks=True, needs_degrees=True)
    assert capabilities(HeteroModel(TypedInput({"a": 4}, 8), GraphSAGE(8, 8, 2, 3))) == ModelCaps()
    hetero_body = HeteroBody(torch.nn.Identity(), ["a"], [("a", "to", "a")])
    assert isinstance(hetero_body, BlockModel) and capabilities(hetero_body) == ModelCaps(needs_node_types=True)


def test_the_encoder_builder_resolves_sizes_as_the_trainer_did():
    schema = GraphSchema.homogeneous(0, None, 0)
    node = build_encoder(Params(hidden=8), in_channels=5, num_classes=3, schema=schema, num_edge_features=4)
    assert (node.kind, node.out_channels, node.edge_dim) == ("sage", 3, 0)   # sage ignores edge features
    link = build_encoder(Params(hidden=8, task="link", model="gat"), in_channels=5, num_classes=3, schema=schema,
                         num_edge_features=4)
    assert (link.kind, link.out_channels, link.edge_dim) == ("gat", 8, 4)
    off = build_encoder(Params(hidden=8, model="gat", edge_features=False), in_channels=5, num_classes=3,
                        schema=schema, num_edge_features=4)
    assert off.edge_dim == 0
    torch.manual_seed(0)
    first = build_encoder(Params(hidden=8, fanouts=[5, 5]), in_channels=5, num_classes=3, schema=schema,
                          num_edge_features=0)
    torch.manual_seed(0)
    again = build_model("sage", **{**SIZES, "hidden": 8})
    assert all(torch.equal(a, b) for a, b in zip(first.module.state_dict().values(), again.state_dict().values()))
