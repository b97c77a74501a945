"""Link decoders and loss: the dot and Hadamard-MLP scores, and BCE as OGB's baselines weigh the two sides."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from stages.train.models.plugins import make_decoder
from stages.train.tasks.link_decoders import MLPDecoder, link_loss
from storage.errors import InputError


def test_decoders_score_pairs_symmetrically():
    gen = torch.Generator().manual_seed(0)
    h_u, h_v = torch.randn(5, 8, generator=gen), torch.randn(5, 8, generator=gen)
    dot = make_decoder("dot", 8, 0.0)
    assert torch.allclose(dot(h_u, h_v), torch.einsum("nc,nc->n", h_u, h_v))
    torch.manual_seed(0)
    mlp = make_decoder("mlp", 8, 0.0)
    assert isinstance(mlp, MLPDecoder) and mlp(h_u, h_v).shape == (5,)
    assert torch.allclose(mlp(h_u, h_v), mlp(h_v, h_u))   # the Hadamard product is symmetric
    mlp(h_u, h_v).sum().backward()
    assert all(p.grad is not None for p in mlp.parameters())
    with pytest.raises(InputError, match="has no attribute 'cosine'"):
        make_decoder("stages.train.tasks.link_decoders:cosine", 8, 0.0)


def test_a_plugin_decoder_is_built_with_the_embedding_width():
    decoder = make_decoder("examples.link_decoder:bilinear", 8, 0.0)
    h_u, h_v = torch.randn(3, 8), torch.randn(3, 8)
    assert decoder(h_u, h_v).shape == (3,)
    assert decoder.weight.shape == (8, 8)


def test_link_loss_weighs_each_side_as_a_mean():
    pos, neg = torch.tensor([2.0, -1.0]), torch.tensor([0.5, -3.0, 1.0, 0.0])
    want = -F.logsigmoid(pos).mean() - F.logsigmoid(-neg).mean()
    assert torch.allclose(link_loss(pos, neg), want)
    empty = torch.zeros(0, requires_grad=True)
    loss = link_loss(empty, empty)
    loss.backward()
    assert float(loss.detach()) == 0.0 and empty.grad is not None
