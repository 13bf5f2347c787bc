"""The training recipe's batch code on a tiny SRformer: collate, loss, backward, decode."""

import pytest
import torch

from models.minilm import load_minilm_encoder, load_minilm_tokenizer
from models.srformer import SRformer, SRformerConfig
from models.srformer_weights import load_srformer, warm_start_from_minilm
from models.training.srformer import (
    Example,
    RecurrentDiagnostics,
    clipping_groups,
    collate,
    loss_of,
    summarize_examples,
)


def _example(seed: int, length: int) -> Example:
    generator = torch.Generator().manual_seed(seed)
    source = torch.randint(1000, 1100, (length,), generator=generator)
    return Example(key=str(seed), source=source, enc=torch.randn(length, 16, generator=generator).half(),
                   target=source[3:9].clone(), reference="")


def test_collate_loss_and_decode_run_on_a_tiny_model():
    torch.manual_seed(0)
    model = SRformer(SRformerConfig(cross_attention="srformer", segment_size=4, embed_dim=16, d_model=16, n_layer=1,
                                    n_head=2, d_ff=32, max_target=32, dropout=0.0))
    examples = [_example(1, 30), _example(2, 19)]
    batch = collate(model, examples, max_target=8)
    enc, mask, source, tokens, target_index = batch[:5]
    assert enc.shape == (2, 30, 16) and mask.sum().item() == 49
    assert (target_index[1, :7] >= 0).all()  # every summary token is in its source, [SEP] ends it
    loss = loss_of(model, batch)
    loss.backward()
    assert torch.isfinite(loss) and model.embed_in.weight.grad is not None
    texts, speed = summarize_examples(model, examples, load_minilm_tokenizer(), batch_size=2)
    assert len(texts) == 2 and speed["generated_tokens_mean"] >= 1


def test_recurrent_part_is_clipped_apart_and_its_size_logged():
    torch.manual_seed(0)
    model = SRformer(SRformerConfig(cross_attention="srformer", recurrent_norm="kernel", segment_size=4, embed_dim=16,
                                    d_model=16, n_layer=2, n_head=2, d_ff=32, max_target=32, dropout=0.0)).train()
    loss_of(model, collate(model, [_example(1, 30), _example(2, 19)], max_target=8)).backward()
    together, apart = clipping_groups(model, False), clipping_groups(model, True)
    every = {id(p) for p in model.parameters()}
    assert {id(p) for p in together["all"]} == every
    assert {id(p) for p in apart["recurrent"]} == {id(p) for n, p in model.named_parameters() if ".raf." in n}
    assert {id(p) for p in apart["rest"]} | {id(p) for p in apart["recurrent"]} == every
    diagnostics = RecurrentDiagnostics()
    diagnostics.add(model, {name: float(torch.nn.utils.clip_grad_norm_(group, 1.0)) for name, group in apart.items()})
    summary = diagnostics.summary()
    assert set(summary) == {"clip_factor_rest", "clip_factor_recurrent", "or_over_os_l0", "or_over_os_l1",
                            "raf_fired_l0", "raf_fired_l1"}
    assert 0 < summary["or_over_os_l0"] and 0 <= summary["raf_fired_l0"] <= 1
    assert 0 < summary["clip_factor_rest"] <= 1


def test_warm_start_copies_minilm_layers_bert2bert_style():
    """The warm-started decoder's embeddings and each block's self-attention and MLP sublayers compute
    MiniLM's: at the last position causal attention sees every token, so it equals BERT's bidirectional one."""
    config = SRformerConfig(norm_position="post", d_model=384, n_head=12, d_ff=1536, n_layer=2, dropout=0.0,
                            layer_norm_eps=1e-12)
    model = load_srformer(config=config)
    warm_start_from_minilm(model)
    bert = load_minilm_encoder().eval()
    ids = torch.tensor([[101, 7592, 2088, 2003, 1037, 3231, 6251, 1012]])
    with torch.no_grad():
        x = model.ln_e(model.embed_in(model.wte[ids]) + model.wpe(torch.arange(ids.shape[1])))
        expected = bert.embed(ids)
        torch.testing.assert_close(x, expected, atol=1e-4, rtol=0)
        no_mask = torch.zeros(1)
        for block, layer in zip(model.blocks, bert.layer, strict=False):  # the decoder's 2 of MiniLM's 6
            h = layer.attention(x, no_mask)
            torch.testing.assert_close(block.ln_1(x + block.attn(x))[:, -1], h[:, -1], atol=1e-4, rtol=0)
            x = layer(x, no_mask)
            torch.testing.assert_close(block.ln_3(h + block.mlp(h)), x, atol=1e-4, rtol=0)
    with pytest.raises(ValueError, match="MiniLM's shape"):
        warm_start_from_minilm(load_srformer(config=SRformerConfig(d_model=128, n_head=4, d_ff=512)))


def test_a_full_attention_decoder_loads_into_the_other_modes(tmp_path):
    """Every mode shares the projections, so a full-attention checkpoint can be scored or trained on as a
    segmented or SRformer decoder: the shared weights are copied, the RAF starts fresh. An SRformer
    checkpoint that lacks its RAF, or any checkpoint of another shape, is refused."""
    from models.checkpoint import load_checkpoint, save_checkpoint
    from models.srformer_weights import load_decoder_weights
    from tests.tiny_checkpoints import tiny_srformer

    full = load_checkpoint(tiny_srformer(tmp_path / "full", mode="full"))
    as_kernel = load_srformer(str(full.folder), cross_attention="srformer", recurrent_norm="kernel")
    for name, tensor in full.state_dict.items():
        torch.testing.assert_close(as_kernel.state_dict()[name], tensor.float(), rtol=0, atol=0)
    fresh = SRformer(as_kernel.config).state_dict()
    assert all(torch.equal(as_kernel.state_dict()[name], fresh[name]) for name in fresh if ".raf." in name)
    assert load_srformer(str(full.folder), cross_attention="segmented").config.cross_attention == "segmented"

    kernel = load_checkpoint(tiny_srformer(tmp_path / "kernel", recurrent_norm="kernel"))
    without_raf = {name: t for name, t in kernel.state_dict.items() if ".raf." not in name}
    save_checkpoint(tmp_path / "broken", "srformer", SRformerConfig(**kernel.config), without_raf, {})
    with pytest.raises(ValueError, match="does not fit"):
        load_srformer(str(tmp_path / "broken"))
    wider = SRformer(SRformerConfig(**{**kernel.config, "d_model": 64, "d_ff": 128}))
    with pytest.raises((ValueError, RuntimeError)):
        load_decoder_weights(wider, full)


@pytest.mark.parametrize("name", ["srformer-news", "srformer-pubmed"])
def test_a_shipped_checkpoint_loads_and_saves_under_its_own_names(name):
    """Every tensor of a shipped checkpoint loads and comes back from ``state_dict()`` under its name, the
    salience head's included (models/salience_head.py); its config's copy switches, on in every shipped
    checkpoint, are read as the model (models/srformer_weights.py), and a config with one off is refused."""
    from pathlib import Path

    from models.checkpoint import load_checkpoint
    from models.srformer_weights import srformer_config

    checkpoint = load_checkpoint(Path(__file__).resolve().parents[1] / "weights" / name)
    assert all(checkpoint.config[switch] for switch in ("copy", "token_features", "copy_bias"))
    state = load_srformer(checkpoint).state_dict()
    assert set(state) == set(checkpoint.state_dict) and "salience_position" in state
    for key, tensor in checkpoint.state_dict.items():
        torch.testing.assert_close(state[key], tensor.float(), rtol=0, atol=0)
    with pytest.raises(ValueError, match="copy_bias=False"):
        srformer_config({**checkpoint.config, "copy_bias": False})
