"""The SRformer summarizer as a servable: an encoder-window graph and a decoder-step graph.

- ``encode_window``: (window_ids (B, w), first_prev (B,)) -> per decoder layer l: the window's
  cross-attention keys ``k{l}`` and values ``v{l}`` (B, h, w, dh) — appended to the session —
  and its contributions ``kv{l}`` (B, h, dh, c), ``ksq{l}`` (B, h) to the running K'V and
  sum(K^2) accumulators (Eq. 15, 13; c = dh, or dh + 1 for the kernel form of O_R: phi(K)'[V, 1],
  Eq. 22). MiniLM reads the window as ``[CLS] w [SEP]`` (w <= 510).
- ``output_head`` (models whose candidates are the document's own ids): vocab_ids (B, V) -> the
  tied output layer folded for them, ``vocab_weight`` (B, V, d) and ``vocab_bias`` (B, V); run once
  per document, both are fixed inputs of every decode step after (``SRformer.output_head``).
- ``decode_step``: one step of Algorithm 1 — token, position, self-attention caches and RAF
  state in; log-probabilities over the document's candidate ids and the next caches out.

Tokenizing, cutting text into windows, the vocabulary of candidate ids and the search (greedy,
beam, no-repeat n-gram) run outside the graphs: ``models/summary_stream.py`` and ``models/decoding.py``,
which the service wraps (``service/runtime/summarize.py``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn as nn

from models.checkpoint import Checkpoint
from models.detokenize import Detokenizer, sentence_end_ids
from models.letter_case import DocumentCase
from models.minilm import load_minilm_encoder
from models.segment import TensorSpec
from models.sentence_choice import copy_sentences
from models.serving.rmt import tokenizer_file
from models.serving.servable import Graph, Servable
from models.srformer import SRformer, SRformerConfig, kernel_product
from models.srformer_weights import load_srformer
from models.summary_stream import Arrays, SummaryStream, state_and_chunk_specs
from models.text_stream import PENDING_BYTES, SegmentCutter


class EncodeWindow(nn.Module):
    def __init__(self, model: SRformer, encoder: nn.Module) -> None:
        super().__init__()
        self.model = model
        self.encoder = encoder

    def forward(self, window_ids: torch.Tensor, first_prev: torch.Tensor) -> tuple[torch.Tensor, ...]:
        c = self.model.config
        B = window_ids.shape[0]
        cls = torch.full_like(window_ids[:, :1], c.bos_id)
        sep = torch.full_like(window_ids[:, :1], c.eos_id)
        full = torch.cat([cls, window_ids, sep], dim=1)  # (B, w+2)
        enc = self.encoder(input_ids=full, attention_mask=torch.ones_like(full))[:, 1:-1]  # (B, w, E)
        mask = torch.ones(B, window_ids.shape[1], dtype=torch.bool, device=window_ids.device)
        outputs: list[torch.Tensor] = []
        for mem in self.model.memory(enc, mask, window_ids, first_prev):
            outputs += [mem["k"], mem["v"], mem["kv"], mem["ksq"]]
        if self.model.salience is not None:  # a_t per token (models/salience_head.py)
            outputs.append(self.model.salience(enc))
        return tuple(outputs)


class OutputHead(nn.Module):
    def __init__(self, model: SRformer) -> None:
        super().__init__()
        self.model = model

    def forward(self, vocab_ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return self.model.output_head(vocab_ids)


class DecodeStep(nn.Module):
    """Positional wrapper of :meth:`SRformer.step` (the cache and memory dicts flattened)."""

    def __init__(self, model: SRformer) -> None:
        super().__init__()
        self.model = model
        self.n_layer = model.config.n_layer
        self.folded = model.folds_output_head

    def forward(self, token: torch.Tensor, t: torch.Tensor, mask: torch.Tensor, vocab_ids: torch.Tensor,
                vocab_mask: torch.Tensor, src_index: torch.Tensor, prev: torch.Tensor, last: torch.Tensor,
                self_mask: torch.Tensor, *rest: torch.Tensor) -> tuple[torch.Tensor, ...]:
        # rest: vocab_weight, vocab_bias when folded; then per layer self_k, self_v, membrane, raf_out
        # (cache), then k, v, kv, ksq (memory)
        head = (rest[0], rest[1]) if self.folded else None
        layers = rest[2:] if self.folded else rest
        cache = {"prev": prev, "last": last, "self_mask": self_mask}
        memory = []
        for layer in range(self.n_layer):
            self_k, self_v, membrane, raf_out, k, v, kv, ksq = layers[8 * layer: 8 * layer + 8]
            cache.update({f"self_k{layer}": self_k, f"self_v{layer}": self_v,
                          f"membrane{layer}": membrane, f"raf_out{layer}": raf_out})
            memory.append({"k": k, "v": v, "kv": kv, "ksq": ksq})
        logp, new = self.model.step(token, t, cache, memory, mask, vocab_ids, vocab_mask, src_index, head)
        outputs = [logp, new["prev"], new["last"], new["self_mask"]]
        for layer in range(self.n_layer):
            outputs += [new[f"self_k{layer}"], new[f"self_v{layer}"], new[f"membrane{layer}"], new[f"raf_out{layer}"]]
        return tuple(outputs)


@dataclass(frozen=True)
class ServedDecoding:
    """How the service writes a checkpoint's summaries when a request names no option."""
    decoding: str  # "sentence" (copy, the salience head's choice) or "free" (generation)
    beams: int
    no_repeat_ngram: int
    adjacency: float  # sentence copy's choice options (models.sentence_choice.choose_sentences)
    trigram_overlap: float


def served_decoding(checkpoint: Checkpoint) -> ServedDecoding:
    """The decoding chosen on dev, where the checkpoint records it (``extras.decode``); otherwise sentence copy
    for a checkpoint with a salience head and free generation without one. Export and eval both read it here."""
    extras = checkpoint.extras
    chosen = extras.get("decode", extras)
    salience = bool(checkpoint.config.get("salience", False))
    return ServedDecoding(
        decoding=str(chosen.get("decoding", "sentence" if salience else "free")),
        beams=int(chosen.get("beams", 1) or 1),
        no_repeat_ngram=int(chosen.get("no_repeat_ngram", 0) or 0),
        adjacency=float(chosen.get("adjacency", 0.0) or 0.0),
        trigram_overlap=float(chosen.get("trigram_overlap", 1.0)),
    )


def srformer_servable(checkpoint: Checkpoint) -> Servable:
    assert checkpoint.folder is not None
    model = load_srformer(checkpoint)
    c = model.config
    h, dh, layers = c.n_head, c.d_model // c.n_head, c.n_layer
    encoder = load_minilm_encoder().eval()  # the frozen MiniLM the model was trained on
    folded = model.folds_output_head  # the decode graph reads the output_head graph's outputs

    def encode_sample(batch: int, generator: torch.Generator) -> tuple[torch.Tensor, ...]:
        width = int(torch.randint(3, 40, (1,), generator=generator))
        ids = torch.randint(1000, c.vocab_size, (batch, width), generator=generator)
        return ids, torch.randint(1000, c.vocab_size, (batch,), generator=generator)

    def decode_sample(batch: int, generator: torch.Generator) -> tuple[torch.Tensor, ...]:
        k = int(torch.randint(8, 4 * c.segment_size, (1,), generator=generator))
        steps = int(torch.randint(2, 6, (1,), generator=generator))  # >= 2: no 0/1 specialization
        source = torch.randint(1000, 1200, (batch, k), generator=generator)
        vocab_ids = torch.sort(torch.unique(torch.cat([source.flatten(), torch.tensor([c.eos_id])])))[0]
        vocab_ids = vocab_ids.expand(batch, -1).contiguous()
        src_index = torch.searchsorted(vocab_ids, source)
        mask = torch.ones(batch, k, dtype=torch.bool)
        token = vocab_ids[:, 0]
        t = torch.full((batch,), steps, dtype=torch.int64)
        prev = torch.zeros(batch, dtype=torch.int64)
        last = source[:, 0]
        self_mask = torch.rand(batch, steps, generator=generator) < 0.8  # padded rows of a shared batch
        flat: list[torch.Tensor] = []
        for _ in range(layers):
            flat += [torch.randn(batch, h, steps, dh, generator=generator),
                     torch.randn(batch, h, steps, dh, generator=generator),
                     torch.randn(batch, h, dh, dh, generator=generator) * 0.1,
                     torch.relu(torch.randn(batch, h, dh, dh, generator=generator)) * 0.1]
            K = torch.randn(batch, h, k, dh, generator=generator)
            V = torch.randn(batch, h, k, dh, generator=generator)
            kv = kernel_product(K, V, torch.ones(batch, 1, k, 1)) if c.kv_columns > dh else K.transpose(-2, -1) @ V
            flat += [K, V, kv, (K * K).sum(dim=(-2, -1))]
        head = [part.detach() for part in model.output_head(vocab_ids)] if folded else []
        return (token, t, mask, vocab_ids, torch.ones_like(vocab_ids, dtype=torch.bool), src_index, prev, last,
                self_mask, *head, *flat)

    def head_sample(batch: int, generator: torch.Generator) -> tuple[torch.Tensor, ...]:
        width = int(torch.randint(3, 40, (1,), generator=generator))
        return (torch.sort(torch.randint(1000, c.vocab_size, (batch, width), generator=generator), dim=1)[0],)

    window_outputs: list[TensorSpec] = []
    for layer in range(layers):
        window_outputs += [TensorSpec(f"k{layer}", "float32", ("batch", h, "window", dh)),
                           TensorSpec(f"v{layer}", "float32", ("batch", h, "window", dh)),
                           TensorSpec(f"kv{layer}", "float32", ("batch", h, dh, c.kv_columns)),
                           TensorSpec(f"ksq{layer}", "float32", ("batch", h))]
    if c.salience:
        window_outputs.append(TensorSpec("salience", "float32", ("batch", "window")))
    encode = Graph(
        name="encode_window",
        module=EncodeWindow(model, encoder),
        inputs=[TensorSpec("window_ids", "int64", ("batch", "window")),
                TensorSpec("first_prev", "int64", ("batch",))],
        outputs=window_outputs,
        sample_inputs=encode_sample,
        onnx_exporter="torchscript",  # torch 2.13's torch.export fails on this graph's guards; tracing works
    )
    cache_in: list[TensorSpec] = []
    cache_out: list[TensorSpec] = []
    state_outputs = {"prev": "next_prev", "last": "next_last", "self_mask": "next_self_mask"}
    for layer in range(layers):
        names = [(f"self_k{layer}", ("batch", h, "steps", dh)), (f"self_v{layer}", ("batch", h, "steps", dh)),
                 (f"membrane{layer}", ("batch", h, dh, dh)), (f"raf_out{layer}", ("batch", h, dh, dh))]
        cache_in += [TensorSpec(name, "float32", shape) for name, shape in names]
        cache_out += [TensorSpec(f"next_{name}", "float32",
                                 tuple("next_steps" if axis == "steps" else axis for axis in shape))
                      for name, shape in names]
        state_outputs.update({name: f"next_{name}" for name, _ in names})
    decode_inputs = [
        TensorSpec("token", "int64", ("batch",)),
        TensorSpec("t", "int64", ("batch",)),
        TensorSpec("mask", "bool", ("batch", "source")),
        TensorSpec("vocab_ids", "int64", ("batch", "vocab")),
        TensorSpec("vocab_mask", "bool", ("batch", "vocab")),
        TensorSpec("src_index", "int64", ("batch", "source")),
        TensorSpec("prev", "int64", ("batch",)),
        TensorSpec("last", "int64", ("batch",)),
        TensorSpec("self_mask", "bool", ("batch", "steps")),
    ]
    head_outputs = [TensorSpec("vocab_weight", "float32", ("batch", "vocab", c.d_model)),
                    TensorSpec("vocab_bias", "float32", ("batch", "vocab"))]
    if folded:
        decode_inputs += head_outputs
    for layer in range(layers):
        decode_inputs += cache_in[4 * layer: 4 * layer + 4] + [
            TensorSpec(f"k{layer}", "float32", ("batch", h, "source", dh)),
            TensorSpec(f"v{layer}", "float32", ("batch", h, "source", dh)),
            TensorSpec(f"kv{layer}", "float32", ("batch", h, dh, c.kv_columns)),
            TensorSpec(f"ksq{layer}", "float32", ("batch", h)),
        ]
    decode = Graph(
        name="decode_step",
        module=DecodeStep(model),
        inputs=decode_inputs,
        outputs=[TensorSpec("logp", "float32", ("batch", "vocab")), TensorSpec("next_prev", "int64", ("batch",)),
                 TensorSpec("next_last", "int64", ("batch",)),
                 TensorSpec("next_self_mask", "bool", ("batch", "next_steps")), *cache_out],
        sample_inputs=decode_sample,
        state_outputs=state_outputs,
        # rows of different documents share a batch zero-padded along these axes; each mask input
        # marks the positions that are a row's own (the graph never reads the rest)
        axis_masks={"source": "mask", "vocab": "vocab_mask", "steps": "self_mask"},
        onnx_exporter="torchscript",  # varargs + dynamic shapes trip torch.export in torch 2.13
    )
    head_graph = Graph(
        name="output_head",
        module=OutputHead(model),
        inputs=[TensorSpec("vocab_ids", "int64", ("batch", "vocab"))],
        outputs=head_outputs,
        sample_inputs=head_sample,
        onnx_exporter="torchscript",
        sized_like_served=False,  # a document's candidates number hundreds to thousands, the sample's 3 to 40
    )
    state_spec, _ = state_and_chunk_specs(stream_cutter(c), layers, h, dh, c.kv_columns, c.salience)
    extras = checkpoint.extras
    served = served_decoding(checkpoint)
    head = model.salience
    position = head.position.tolist() if head is not None else None
    lexicon = head.lexicon() if head is not None else None
    return Servable(
        name="",
        task="summarize",
        family="srformer",
        graphs=[encode, head_graph, decode] if folded else [encode, decode],
        state_spec=state_spec,
        settings={
            **stream_settings(c),
            "decoding": served.decoding,
            "salience_position": position,
            "salience_lexical": list(lexicon.weights) if lexicon else None,  # q; v and idf: assets["lexicon"]
            "beam_size": served.beams,
            "no_repeat_ngram": served.no_repeat_ngram,
            "copy_adjacency": served.adjacency,  # sentence copy's choice
            "copy_trigram_overlap": served.trigram_overlap,
            "metrics": extras.get("test_rouge", extras.get("metrics", {})),
        },
        assets={"tokenizer": tokenizer_file()},
        tensor_assets={"lexicon": {"token_weight": head.word.detach().float(),
                                   "idf": head.idf.float()}} if head is not None and lexicon else {},
        initial_state={"last_source_id": torch.tensor([c.bos_id])},
    )


# ---------------------------------------------------------------------------------------------
# The stream's settings (written into the manifest) and the summarizer run eagerly through it


def stream_cutter(c: SRformerConfig, tokenizer: object = None) -> SegmentCutter:
    """The text cutter of the summarizer: encoder windows of ``encoder_window`` tokens (+ [CLS], [SEP]),
    no more windows than ``max_source`` tokens fill."""
    max_windows = -(-c.max_source // c.encoder_window) if c.max_source > 0 else 100_000
    return SegmentCutter(tokenizer, c.encoder_window + 2, max_windows, PENDING_BYTES)


def stream_settings(c: SRformerConfig) -> dict[str, object]:
    """What :class:`SummaryStream` reads from a manifest: the schedule, the windows, the chunk layout."""
    h, dh = c.n_head, c.d_model // c.n_head
    cutter = stream_cutter(c)
    _, chunk_spec = state_and_chunk_specs(cutter, c.n_layer, h, dh, c.kv_columns, c.salience)
    return {
        "cross_attention": c.cross_attention,
        "recurrent_norm": c.recurrent_norm,
        "segment_size": c.segment_size,
        "summary_ratio": c.summary_ratio,
        "summary_length": c.summary_length,
        "encoder_window": c.encoder_window,
        "max_source": c.max_source,
        "max_windows": cutter.max_segments,
        "pending_bytes": PENDING_BYTES,
        "max_target": c.max_target,
        "output_vocab": c.output_vocab,
        "vocab_size": c.vocab_size,
        "n_layer": c.n_layer,
        "n_head": h,
        "head_dim": dh,
        "bos_id": c.bos_id,
        "eos_id": c.eos_id,
        "pad_id": c.pad_id,
        "chunk_spec": [spec.as_dict() for spec in chunk_spec],
    }


class EagerSummarizer:
    """The summarizer over text pieces, on the eager modules of its ``encode_window`` graph and the
    model's own search: the same stream the service wraps (``models/summary_stream.py``), so training's
    ``rtserve eval --stream`` and the tests read documents exactly as a session does."""

    def __init__(self, model: SRformer, encoder: nn.Module, tokenizer: object) -> None:
        self.model = model.eval()
        self.encode_window = EncodeWindow(self.model, encoder.eval())
        self.tokenizer = tokenizer
        self.stream = SummaryStream(stream_settings(model.config), tokenizer)
        c = model.config
        self.state_spec, _ = state_and_chunk_specs(stream_cutter(c), c.n_layer, c.n_head, c.d_model // c.n_head,
                                                   c.kv_columns, c.salience)
        self.window_outputs = [f"{kind}{layer}" for layer in range(c.n_layer) for kind in ("k", "v", "kv", "ksq")]
        self.window_outputs += ["salience"] if c.salience else []

    def init_state(self) -> dict[str, np.ndarray]:
        """``init_state(1)``: zeros, and [CLS] as the token before the first window."""
        state = {spec.name: np.zeros([1 if axis == "batch" else axis for axis in spec.shape], dtype=spec.dtype)
                 for spec in self.state_spec}
        state["last_source_id"] = np.array([self.model.config.bos_id], dtype=np.int64)
        return state

    @torch.no_grad()
    def _encode(self, state: dict[str, np.ndarray], windows: list) -> tuple[dict[str, np.ndarray], Arrays | None]:
        parts = []
        for window in windows:
            inputs = self.stream.window_inputs(state, window)
            if inputs is None:
                continue
            outputs = self.encode_window(*(torch.from_numpy(inputs[n]) for n in ("window_ids", "first_prev")))
            named = {name: tensor.numpy() for name, tensor in zip(self.window_outputs, outputs, strict=True)}
            state, part = self.stream.absorb(state, inputs, named)
            parts.append(part)
        return state, self.stream.join(parts)

    def feed(self, state: dict[str, np.ndarray], text: str) -> tuple[dict[str, np.ndarray], Arrays | None]:
        """One text piece: the new bounded state and the chunk it appends (the piece's text and the windows
        it closed; None for an empty piece), as the service's pipeline does."""
        cut, windows = self.stream.feed(state, text)
        new, chunk = self._encode(cut, windows)
        parts = [self.stream.text_part(text)] if text and self.stream.keeps_text(state) else []
        return new, self.stream.join([*parts, *([chunk] if chunk is not None else [])])

    def close(self, state: dict[str, np.ndarray], chunks: list[Arrays]
              ) -> tuple[Arrays, np.ndarray, str, np.ndarray | None]:
        """End of document: the last window closed; the decoder's memory, the source ids, the text and the
        salience logits of the tokens read (None without a head)."""
        cut, windows = self.stream.flush(state)
        final, chunk = self._encode(cut, windows)
        chunks = [*chunks, chunk] if chunk is not None else chunks
        memory, source_ids = self.stream.memory(final, chunks)
        return (memory, source_ids, *self.stream.document(chunks))

    def summarize_pieces(self, pieces: list[str], beams: int = 1, no_repeat_ngram: int = 0,
                         max_len: int | None = None, decoding: str | None = None, adjacency: float = 0.0,
                         trigram_overlap: float = 1.0) -> str:
        """The summary the service writes for these pieces (``decoding``: the model's default when None;
        ``adjacency``, ``trigram_overlap``: sentence copy's, :func:`models.sentence_choice.choose_sentences`)."""
        state, chunks = self.init_state(), []
        for piece in pieces:
            state, chunk = self.feed(state, piece)
            if chunk is not None:
                chunks.append(chunk)
        memory, source_ids, text, salience = self.close(state, chunks)
        c = self.model.config
        read = source_ids.shape[1]
        decoding = decoding or ("sentence" if c.salience else "free")
        if decoding == "sentence":
            head = self.model.salience
            assert salience is not None and head is not None, "no salience head"
            target = c.summary_length or max(1, math.ceil(c.summary_ratio * read))
            sentences = copy_sentences(text, self.tokenizer, salience, read, head.position.tolist(), target, max_len,
                                       head.lexicon(), adjacency, trigram_overlap)
            return " ".join(sentence for sentence, _ in sentences)
        layers = [{kind: torch.from_numpy(memory[f"{kind}{layer}"]) for kind in ("k", "v", "kv", "ksq")}
                  for layer in range(c.n_layer)]
        ids = torch.from_numpy(source_ids)
        mask = torch.ones_like(ids, dtype=torch.bool)
        summary = self.model.generate(layers, mask, ids, max_len=max_len, beams=beams, no_repeat_ngram=no_repeat_ngram,
                                      ends=sentence_end_ids(self.tokenizer))[0]
        detokenizer = Detokenizer(self.tokenizer)
        known = detokenizer.vocabulary(source_ids[0]) if c.output_vocab != "full" else None
        return detokenizer.text(summary, known, DocumentCase(text))

    def summarize(self, text: str, **options: object) -> str:
        """Whole document: one piece."""
        return self.summarize_pieces([text], **options)  # type: ignore[arg-type]
