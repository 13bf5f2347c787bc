"""SRformer's cross-attention math, checked on tiny random models (no MiniLM weights)."""

from __future__ import annotations

import pytest
import torch

from models.srformer import SegmentRuns, SRformer, SRformerConfig, remaining_products

TOL = 1e-5


def tiny(mode: str, **overrides: object) -> SRformer:
    fields: dict[str, object] = dict(cross_attention=mode, segment_size=4, summary_ratio=0.5, vocab_size=60,
                                     embed_dim=12, d_model=16, n_layer=2, n_head=2, d_ff=32, max_target=64,
                                     dropout=0.0, bos_id=1, eos_id=2, pad_id=0)
    config = SRformerConfig(**{**fields, **overrides})  # type: ignore[arg-type]
    torch.manual_seed(0)
    model = SRformer(config).eval()
    with torch.no_grad():  # non-trivial RAF parameters: some neurons fire, some do not
        model.wte.normal_()
        for block in model.blocks:
            if getattr(block.cross, "gate", None) is not None:
                block.cross.gate.uniform_(0.5, 1.5)
            if getattr(block.cross, "raf", None) is not None:
                block.cross.raf.threshold.uniform_(-0.05, 0.3)
                block.cross.raf.leak.uniform_(-1.0, 3.0)
    return model


def batch(model: SRformer, lengths: list[int], k: int, T: int, seed: int = 1):
    """Random encoder outputs (right-padded to k), masks, source ids and decoder inputs."""
    g = torch.Generator().manual_seed(seed)
    c = model.config
    B = len(lengths)
    enc = torch.randn(B, k, c.embed_dim, generator=g)
    mask = torch.arange(k)[None, :] < torch.tensor(lengths)[:, None]  # (B, k)
    source_ids = torch.randint(3, c.vocab_size, (B, k), generator=g)
    tokens = torch.randint(3, c.vocab_size, (B, T), generator=g)
    tokens[:, 0] = c.bos_id % c.vocab_size
    return enc, mask, source_ids, tokens


def fix_ids(model: SRformer) -> None:
    model.config.bos_id, model.config.eos_id, model.config.pad_id = 1, 2, 0


def teacher_forced(model: SRformer, enc, mask, source_ids, tokens) -> torch.Tensor:
    memory = model.memory(enc, mask, source_ids)
    return model(tokens, memory, mask, *model.vocab(source_ids, mask))


def step_by_step(model: SRformer, enc, mask, source_ids, tokens, folded: bool = False) -> torch.Tensor:
    memory = model.memory(enc, mask, source_ids)
    vocab = model.vocab(source_ids, mask)
    head = model.output_head(vocab[0]) if folded else None
    cache = model.init_cache(tokens.shape[0])
    out = []
    for t in range(tokens.shape[1]):
        logits, cache = model.step(tokens[:, t], t, cache, memory, mask, *vocab, head)
        out.append(logits)
    return torch.stack(out, dim=1)


def test_one_segment_covering_all_keys_equals_full_attention():
    full = tiny("full")
    segmented = tiny("segmented", segment_size=64)  # s >= k: a single segment
    segmented.load_state_dict(full.state_dict())
    for model in (full, segmented):
        fix_ids(model)
    data = batch(full, [40, 23], k=40, T=17)
    a, b = teacher_forced(full, *data), teacher_forced(segmented, *data)
    valid = data[1].any(dim=0)
    assert a.abs().max() > 0.1
    torch.testing.assert_close(b, a, atol=TOL, rtol=0)
    assert valid.all()


def test_remaining_product_eq16_equals_direct_sum_over_other_segments():
    model = tiny("srformer")
    enc, mask, _, _ = batch(model, [37, 22], k=37, T=1)
    mem = model.memory(enc, mask, torch.randint(3, 60, mask.shape))[0]
    s = model.config.segment_size
    P = remaining_products(mem, s)  # (B, h, m, dh, dh)
    K, V = mem["k"], mem["v"]
    B, h, k, dh = K.shape
    assert P.shape[2] == -(-k // s)
    for b in range(B):
        for i in range(P.shape[2]):
            others = [j for j in range(k) if j // s != i and bool(mask[b, j])]
            direct = sum(K[b, :, j, :, None] * V[b, :, j, None, :] for j in others)  # (h, dh, dh)
            torch.testing.assert_close(P[b, :, i], direct, atol=1e-5, rtol=1e-5)
    assert P.abs().max() > 0.1


VARIANTS = [("full", {}), ("segmented", {}), ("srformer", {}), ("srformer", {"recurrent_gate": True}),
            ("srformer", {"recurrent_norm": "kernel"}),
            ("srformer", {"recurrent_norm": "kernel", "recurrent_gate": True}),
            ("srformer", {"recurrent_norm": "kernel", "recurrent_part": "linear"}),
            ("srformer", {"recurrent_norm": "kernel", "segmented_part": False}),
            ("srformer", {"recurrent_part": "off"})]


@pytest.mark.parametrize("mode,options", VARIANTS)
@pytest.mark.parametrize("ratio", [0.5, 0.05])  # q >= m (segments shared) and q < m (segments skipped)
@pytest.mark.parametrize("norm", ["pre", "post"])
def test_step_by_step_equals_teacher_forced(mode, options, ratio, norm):
    model = tiny(mode, summary_ratio=ratio, norm_position=norm, **options)
    fix_ids(model)
    data = batch(model, [45, 29, 8, 3], k=45, T=24)  # T > q for the shorter documents: i clamps to m-1
    parallel = teacher_forced(model, *data)
    stepwise = step_by_step(model, *data)
    assert parallel.shape == stepwise.shape
    finite = parallel > -1e20
    assert finite.any() and parallel[finite].std() > 0.1
    torch.testing.assert_close(stepwise[finite], parallel[finite], atol=TOL, rtol=0)
    assert torch.equal(finite, stepwise > -1e20)


@pytest.mark.parametrize("mode,options", [("full", {}), ("srformer", {"recurrent_norm": "kernel"})])
def test_the_output_layer_folded_once_per_document_equals_it_as_written(mode, options):
    """Decoding reads x (w W_o)' + (w b_o + b_w), folded once per document (output_head); training
    reads (x W_o' + b_o) w' + b_w: the same log-probabilities."""
    model = tiny(mode, **options)
    fix_ids(model)
    data = batch(model, [45, 29, 8, 3], k=45, T=24)
    parallel = teacher_forced(model, *data)
    folded = step_by_step(model, *data, folded=True)
    finite = parallel > -1e20
    assert finite.any() and parallel[finite].std() > 0.1
    torch.testing.assert_close(folded[finite], parallel[finite], atol=TOL, rtol=0)
    assert torch.equal(finite, folded > -1e20)


@pytest.mark.parametrize("mode,options", [("full", {}), ("segmented", {}), ("srformer", {}),
                                          ("srformer", {"recurrent_norm": "kernel"})])
def test_padded_encoder_positions_change_no_output(mode, options):
    model = tiny(mode, **options)
    fix_ids(model)
    enc, mask, source_ids, tokens = batch(model, [26, 26], k=26, T=20)
    g = torch.Generator().manual_seed(7)
    extra = 11  # padded positions with large garbage values (App. A.3: they must not reach K'V)
    enc_pad = torch.cat([enc, 50 * torch.randn(2, extra, enc.shape[2], generator=g)], dim=1)
    mask_pad = torch.cat([mask, torch.zeros(2, extra, dtype=torch.bool)], dim=1)
    ids_pad = torch.cat([source_ids, torch.randint(3, 60, (2, extra), generator=g)], dim=1)
    a = teacher_forced(model, enc, mask, source_ids, tokens)
    b = teacher_forced(model, enc_pad, mask_pad, ids_pad, tokens)
    torch.testing.assert_close(b, a, atol=TOL, rtol=0)
    mem_a, mem_b = model.memory(enc, mask, source_ids), model.memory(enc_pad, mask_pad, ids_pad)
    for la, lb in zip(mem_a, mem_b, strict=True):
        torch.testing.assert_close(lb["kv"], la["kv"], atol=TOL, rtol=0)
    greedy_a = model.generate(mem_a, mask, source_ids, max_len=15)
    greedy_b = model.generate(mem_b, mask_pad, ids_pad, max_len=15)
    assert greedy_a == greedy_b


def test_kernel_products_sum_phi_k_v_and_phi_k_over_other_segments():
    model = tiny("srformer", recurrent_norm="kernel")
    enc, mask, _, _ = batch(model, [37, 22], k=37, T=1)
    mem = model.memory(enc, mask, torch.randint(3, 60, mask.shape))[0]
    s = model.config.segment_size
    P = remaining_products(mem, s, mask)  # (B, h, m, dh, dh + 1)
    K, V = mem["k"], mem["v"]
    B, h, k, dh = K.shape
    assert P.shape[-1] == dh + 1 == model.config.kv_columns
    phi_k = torch.nn.functional.elu(K) + 1
    for b in range(B):
        for i in range(P.shape[2]):
            others = [j for j in range(k) if j // s != i and bool(mask[b, j])]
            numerator = sum(phi_k[b, :, j, :, None] * V[b, :, j, None, :] for j in others)  # (h, dh, dh)
            divisor = sum(phi_k[b, :, j] for j in others)  # (h, dh)
            torch.testing.assert_close(P[b, :, i, :, :dh], numerator, atol=1e-5, rtol=1e-5)
            torch.testing.assert_close(P[b, :, i, :, dh], divisor, atol=1e-5, rtol=1e-5)


def test_kernel_form_without_raf_is_linear_attention_over_the_other_segments():
    """recurrent_part="linear": O_R = phi(Q_t) sum_R phi(K_j)'V_j / (phi(Q_t) sum_R phi(K_j)), Eq. (22)."""
    model = tiny("srformer", recurrent_norm="kernel", recurrent_part="linear", n_layer=1)
    enc, mask, source_ids, _ = batch(model, [30], k=30, T=1)
    cross = model.blocks[0].cross
    mem = model.memory(enc, mask, source_ids)[0]
    x = torch.randn(1, 9, model.config.d_model, generator=torch.Generator().manual_seed(3))
    seg = torch.tensor([[0, 0, 1, 2, 2, 3, 5, 7, 7]])
    Q = cross.q_proj(x).view(1, 9, 2, 8).transpose(1, 2)  # (1, h, T, dh)
    o_s = torch.zeros_like(Q)
    o_r = cross._plus_recurrent(o_s, Q, mem, mask, seg, SegmentRuns.of(seg))  # with O_S = 0: O_R alone
    phi = torch.nn.functional.elu
    for t in range(9):
        others = [j for j in range(30) if j // 4 != int(seg[0, t])]
        weights = ((phi(Q[0, :, t, None, :]) + 1) * (phi(mem["k"][0, :, others]) + 1)).sum(-1)  # (h, |R|)
        expected = (weights[..., None] * mem["v"][0, :, others]).sum(1) / weights.sum(1, keepdim=True)
        torch.testing.assert_close(o_r[0, :, t], expected, atol=1e-5, rtol=1e-5)


def test_recurrent_part_off_is_the_segmented_model_with_the_same_weights():
    segmented = tiny("segmented")
    off = tiny("srformer", recurrent_part="off")
    missing = off.load_state_dict(segmented.state_dict(), strict=False).missing_keys
    assert missing and all(".raf." in key for key in missing)
    off.wte.copy_(segmented.wte)  # a buffer, not in the state dict
    for model in (segmented, off):
        fix_ids(model)
    data = batch(segmented, [45, 29], k=45, T=20)
    torch.testing.assert_close(teacher_forced(off, *data), teacher_forced(segmented, *data), atol=0, rtol=0)


@pytest.mark.parametrize("norm", ["norm_k", "kernel"])
def test_a_document_of_one_segment_gets_no_recurrent_part(norm):
    """R_i is empty when the document fits in one segment: O_R = 0 even where the RAF would fire on
    nothing (a negative threshold), so the model reads as the segmented one."""
    model = tiny("srformer", recurrent_norm=norm)
    off = tiny("srformer", recurrent_norm=norm, recurrent_part="off")
    with torch.no_grad():
        for block in model.blocks:
            block.cross.raf.threshold.fill_(-0.5)
    off.load_state_dict(model.state_dict())
    for m in (model, off):
        fix_ids(m)
    data = batch(model, [4, 3], k=4, T=12)  # s = 4: one segment each
    torch.testing.assert_close(teacher_forced(model, *data), teacher_forced(off, *data), atol=0, rtol=0)
    torch.testing.assert_close(step_by_step(model, *data), teacher_forced(off, *data), atol=TOL, rtol=0)


@pytest.mark.parametrize("mode", ["full", "srformer"])
def test_beam_search_with_one_beam_is_greedy_and_wider_beams_run(mode):
    model = tiny(mode)
    fix_ids(model)
    enc, mask, source_ids, _ = batch(model, [30], k=30, T=1)
    memory = model.memory(enc, mask, source_ids)
    greedy = model.generate(memory, mask, source_ids, max_len=12)
    assert len(greedy[0]) > 0
    beam = model.generate(memory, mask, source_ids, max_len=12, beams=3, no_repeat_ngram=2)
    seq = beam[0]
    bigrams = [tuple(seq[i: i + 2]) for i in range(len(seq) - 1)]
    assert len(bigrams) == len(set(bigrams))  # no-repeat 2-gram holds
    allowed = set(source_ids[0].tolist())
    assert set(seq) <= allowed  # the "source" output vocabulary
