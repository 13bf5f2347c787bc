"""The training recipe's batch code on a tiny SRformer: collate, loss, backward, decode."""

import torch

from models.minilm import load_minilm_tokenizer
from models.srformer import SRformer, SRformerConfig
from models.train_srformer import Example, collate, loss_of, summarize_examples


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
