"""Fitting the SRformer salience head: which of a document's sentences a summary copies.

    python -m models.training.srformer_salience fit weights/srformer-news \\
        --data ../shared/data/bbc-news-summary --train-docs 600 --out runs/news-salience
    python -m models.training.srformer_salience fit runs/notes --train train.jsonl --dev dev.jsonl \\
        --lexical --out runs/notes   # a user's pairs (``rtserve train srformer --train/--dev`` does this itself)

The head (``models/sentence_choice.py`` gives the sentence score) reads the frozen MiniLM encoder's outputs,
which the decoder recipe caches (``models/training/srformer.py``: ``build_cache``), so fitting it never
runs the decoder: per sentence, the mean encoder output and three position features, and the label
"the greedy ROUGE oracle copies this sentence" (the sentences that, added one at a time, most raise
ROUGE-1 + ROUGE-2 F1 against the reference). A logistic regression with an L2 penalty is fitted on the
train split's sentences (features standardised, the scaling folded back into the head's weights); the
penalty is chosen on the dev split by the ROUGE of the summaries the head then copies (the decoder's
``summary_ratio`` / ``summary_length`` sets their length, as in the service). The decoder's weights are
copied unchanged into the output checkpoint, with ``salience`` on and sentence copy as its decoding.

``--lexical`` fits the head with its lexicon (``SRformerConfig.salience_lexical``): the idf counted on the
train documents, and beside those features the sentence's centrality and length and its WordPiece counts
over its length (so the weight of each WordPiece id is the v_x that a token of that id adds to a_t); this
one is fitted with scikit-learn's liblinear, its C chosen on dev the same way.
"""

from __future__ import annotations

import argparse
import json
import math
import re
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from models.checkpoint import load_checkpoint, save_checkpoint
from models.copy_units import DocumentText
from models.data.baselines import greedy_oracle
from models.data.summarization import PairsFile, corpus_of, rouge_scores
from models.sentence_choice import (
    Lexicon,
    choose_sentences,
    lexical_features,
    position_features,
    sentence_scores,
)
from models.serving.srformer import served_decoding
from models.training.common import hardware

PENALTIES = (1e-4, 1e-3, 1e-2, 1e-1)  # L2 strengths tried on dev (per standardised feature)
LEXICAL_C = (0.3, 1.0, 3.0, 10.0, 30.0, 100.0)  # liblinear C (inverse L2) tried on dev, a head with its lexicon


@dataclass
class DocumentSentences:
    key: str
    doc: DocumentText
    features: np.ndarray  # (n, 384) mean encoder output per sentence (zeros where no token was read)
    labels: np.ndarray  # (n,) 1.0: the oracle copies it
    reference: str


# ---- the oracle ---------------------------------------------------------------------------------
def oracle_words(text: str) -> list[str]:
    """The oracle's tokens: runs of lower-case letters and digits."""
    return re.findall(r"[a-z0-9]+", text.lower())


def oracle_labels(sentences: list[str], reference: str) -> list[int]:
    """The sentences the greedy ROUGE oracle copies, added while ROUGE-1 + ROUGE-2 F1 rises (no length stop)."""
    return greedy_oracle(sentences, reference, tokenize=oracle_words, up_to_length=False)


# ---- sentence tables ----------------------------------------------------------------------------
def sentence_tables(data: Path, keys: list[str], max_source: int, corpus: PairsFile | None = None
                    ) -> list[DocumentSentences]:
    """The sentences of ``keys`` in a corpus folder ``data``, or in a user's file (``corpus``, read from ``data``)."""
    from models.minilm import load_minilm_tokenizer
    from models.training.srformer import load_examples_of

    corpus = corpus or corpus_of(data)
    tokenizer = load_minilm_tokenizer()
    tables = []
    for example in load_examples_of(data, keys, max_source, corpus=corpus):
        pair = corpus.read_pair(data, example.key)
        doc = DocumentText(pair.document, tokenizer, len(example.source))
        if not np.array_equal(doc.ids, example.source.numpy()):
            raise AssertionError(f"{example.key}: the cache's ids differ from the document's tokens")
        enc = example.enc.float().numpy()
        n = len(doc.spans)
        kept = doc.sentence_of >= 0
        sums = np.zeros((n, enc.shape[1]), dtype=np.float64)
        np.add.at(sums, doc.sentence_of[kept], enc[kept])
        features = (sums / np.maximum(doc.tokens, 1)[:, None]).astype(np.float32)
        labels = np.zeros(n, dtype=np.float32)
        labels[oracle_labels([doc.sentence(j) for j in range(n)], pair.summary)] = 1.0
        tables.append(DocumentSentences(example.key, doc, features, labels, pair.summary))
    return tables


# ---- fitting ----------------------------------------------------------------------------------
def design(tables: list[DocumentSentences]) -> tuple[np.ndarray, np.ndarray]:
    """Rows of [mean encoder output, position features] for every read sentence, and their labels."""
    rows, labels = [], []
    for table in tables:
        read = table.doc.tokens > 0
        rows.append(np.hstack([table.features, position_features(len(table.labels))])[read])
        labels.append(table.labels[read])
    return np.vstack(rows), np.concatenate(labels)


def fit_head(x: np.ndarray, y: np.ndarray, penalty: float) -> tuple[np.ndarray, float, np.ndarray]:
    """Logistic regression (L-BFGS, L2 ``penalty`` on standardised features): the head's w, b and p."""
    mean, scale = x.mean(axis=0), x.std(axis=0) + 1e-6
    xs = torch.from_numpy((x - mean) / scale).double()
    ys = torch.from_numpy(y).double()
    weight = torch.zeros(x.shape[1], dtype=torch.float64, requires_grad=True)
    bias = torch.zeros((), dtype=torch.float64, requires_grad=True)
    optimizer = torch.optim.LBFGS([weight, bias], max_iter=200, line_search_fn="strong_wolfe")

    def closure() -> torch.Tensor:
        optimizer.zero_grad()
        loss = torch.nn.functional.binary_cross_entropy_with_logits(xs @ weight + bias, ys)
        loss = loss + penalty * (weight**2).sum()
        loss.backward()
        return loss

    optimizer.step(closure)
    w_std = weight.detach().numpy()
    w = w_std / scale  # folded back: w . (x - mean) / scale + b == (w / scale) . x + (b - sum(w mean / scale))
    b = float(bias.detach()) - float((w * mean).sum())
    embed = x.shape[1] - 3
    return w[:embed], b, w[embed:]


def inverse_document_frequency(tables: list[DocumentSentences], vocab: int) -> np.ndarray:
    """idf_x = log((1 + N) / (1 + df_x)) + 1 over the N documents' read tokens (scikit-learn's smooth idf)."""
    df = np.zeros(vocab)
    for table in tables:
        df[np.unique(table.doc.ids)] += 1
    return np.log((1 + len(tables)) / (1 + df)) + 1.0


def _token_shares(doc: DocumentText, vocab: int) -> object:
    """(n, vocab) sparse: each sentence's WordPiece counts over its token count (mean of one-hot ids)."""
    from scipy.sparse import csr_matrix

    kept = doc.sentence_of >= 0
    rows, ids = doc.sentence_of[kept], doc.ids[kept]
    shares = 1.0 / np.maximum(doc.tokens[rows], 1)
    return csr_matrix((shares, (rows, ids)), shape=(len(doc.spans), vocab))  # duplicates are summed


def fit_lexical_head(tables: list[DocumentSentences], idf: np.ndarray, c: float
                     ) -> tuple[np.ndarray, float, np.ndarray, Lexicon]:
    """Logistic regression (liblinear, inverse L2 strength ``c``) on [mean encoder output, position,
    centrality and length] (standardised) and the WordPiece shares: the head's w, b, p and its lexicon."""
    from scipy.sparse import csr_matrix, hstack, vstack
    from sklearn.linear_model import LogisticRegression
    from threadpoolctl import threadpool_limits

    vocab = len(idf)
    dense = [np.hstack([t.features, position_features(len(t.labels)), lexical_features(t.doc, idf)]) for t in tables]
    read = [np.nonzero(t.doc.tokens > 0)[0] for t in tables]
    stacked = np.vstack([d[r] for d, r in zip(dense, read, strict=True)])
    mean, scale = stacked.mean(axis=0), stacked.std(axis=0) + 1e-6
    x = vstack([hstack([csr_matrix((d - mean) / scale), _token_shares(t.doc, vocab)]).tocsr()[r]
                for t, d, r in zip(tables, dense, read, strict=True)])
    y = np.concatenate([t.labels[r] for t, r in zip(tables, read, strict=True)])
    with threadpool_limits(1):
        model = LogisticRegression(C=c, solver="liblinear", max_iter=1000).fit(x, y)
    coefficients = model.coef_[0]
    folded = coefficients[: len(mean)] / scale  # as in fit_head: the standardisation folded back
    b = float(model.intercept_[0]) - float((folded * mean).sum())
    embed = tables[0].features.shape[1]
    w, p, q = folded[:embed], folded[embed : embed + 3], folded[embed + 3 :]
    return w, b, p, Lexicon(coefficients[len(mean) :], idf, (float(q[0]), float(q[1])))


def copied_summaries(tables: list[DocumentSentences], w: np.ndarray, b: float, p: np.ndarray,
                     summary_ratio: float, summary_length: int, lexicon: Lexicon | None = None,
                     adjacency: float = 0.0, trigram_overlap: float = 1.0) -> list[str]:
    """What the service would copy, per document, with this head and the model's choice options (the token
    logits mean per sentence equals the head on the mean feature, so the sentence features stand in for the
    tokens)."""
    out = []
    for table in tables:
        doc = table.doc
        read = int(len(doc.sentence_of))
        token_logits = np.zeros(read)
        kept = doc.sentence_of >= 0
        token_logits[kept] = (table.features @ w + b)[doc.sentence_of[kept]]
        scores = sentence_scores(doc, token_logits, p, lexicon)
        target = summary_length or max(1, math.ceil(summary_ratio * read))
        chosen = choose_sentences(doc, scores, target, adjacency=adjacency, trigram_overlap=trigram_overlap)
        out.append(" ".join(doc.sentence(j) for j in chosen))
    return out


def spread(keys: list[str], count: int) -> list[str]:
    """``count`` keys spread over the split (splits are sorted by category), all when count is 0."""
    if not count or count >= len(keys):
        return keys
    return keys[:: len(keys) // count][:count]


@dataclass
class Documents:
    """Where the fit reads documents: a corpus folder's split, or a user's file of pairs (its every line)."""
    data: Path
    keys: list[str]
    corpus: PairsFile | None = None  # None: ``data`` is a corpus folder

    @classmethod
    def of_split(cls, data: Path, split: str, count: int) -> Documents:
        return cls(data, spread(corpus_of(data).split_keys(data, split), count))

    @classmethod
    def of_file(cls, pairs: PairsFile, count: int) -> Documents:
        return cls(pairs.path, spread(pairs.all_keys(), count), pairs)

    def tables(self, max_source: int) -> list[DocumentSentences]:
        return sentence_tables(self.data, self.keys, max_source, self.corpus)


def fit_salience(checkpoint_path: Path, out: Path, train_documents: Documents, dev_documents: Documents, *,
                 lexical: bool, penalties: Sequence[float] | None = None, threads: int = 1,
                 command: str = "") -> dict:
    """Fit the head on ``train_documents``, choose its penalty on ``dev_documents`` by the ROUGE of what
    the service would copy, and write the checkpoint, its decoder unchanged, to ``out`` (may be
    ``checkpoint_path`` itself). Returns the choice: penalty and dev scores."""
    torch.set_num_threads(threads)
    started = time.time()
    checkpoint = load_checkpoint(checkpoint_path)
    config = dict(checkpoint.config)
    max_source = int(config["max_source"])
    train, dev = train_documents.tables(max_source), dev_documents.tables(max_source)
    x, y = design(train)
    if y.min() == y.max():
        raise ValueError(f"the oracle copies {'every' if y.max() else 'no'} training sentence ({len(y)} sentences in "
                         f"{len(train)} documents): the head needs documents of several sentences, some not copied")
    print(f"salience: {len(train)} train documents, {len(y)} sentences ({y.mean():.1%} copied by the oracle)",
          file=sys.stderr)
    ratio, length = float(config["summary_ratio"]), int(config["summary_length"])
    served = served_decoding(checkpoint)  # the model's sentence-copy options, as the service applies them
    options = {"adjacency": served.adjacency, "trigram_overlap": served.trigram_overlap}
    references = [t.reference for t in dev]
    trials = []
    idf = inverse_document_frequency(train, int(config.get("vocab_size", 30522))) if lexical else None
    for penalty in penalties or (LEXICAL_C if idf is not None else PENALTIES):
        if idf is not None:
            w, b, p, lexicon = fit_lexical_head(train, idf, penalty)
        else:
            (w, b, p), lexicon = fit_head(x, y, penalty), None
        scores = rouge_scores(copied_summaries(dev, w, b, p, ratio, length, lexicon, **options), references)
        trials.append({"penalty": penalty, "dev": scores, "head": (w, b, p, lexicon)})
        print(json.dumps({"penalty": penalty, "dev": scores}), file=sys.stderr)
    best = max(trials, key=lambda t: sum(t["dev"].values()))
    w, b, p, lexicon = best["head"]
    lexical_names = ("salience_token", "salience_lexical", "salience_idf")  # a refit without --lexical drops them
    weights = {name: tensor.float() for name, tensor in checkpoint.state_dict.items() if name not in lexical_names}
    weights["salience.weight"] = torch.from_numpy(w.astype(np.float32))[None]
    weights["salience.bias"] = torch.tensor([b], dtype=torch.float32)
    weights["salience_position"] = torch.from_numpy(p.astype(np.float32))
    if lexicon is not None:
        weights["salience_token"] = torch.from_numpy(lexicon.token_weight.astype(np.float32))
        weights["salience_lexical"] = torch.tensor(lexicon.weights, dtype=torch.float32)
        weights["salience_idf"] = torch.from_numpy(lexicon.idf.astype(np.float32))
    decode = dict(checkpoint.extras.get("decode", {}), decoding="sentence")
    extras = dict(checkpoint.extras, decode=decode, salience={
        "data": str(train_documents.data), "dev_data": str(dev_documents.data), "train_documents": len(train),
        "train_sentences": int(len(y)), "oracle_share": round(float(y.mean()), 4), "dev_documents": len(dev),
        "lexical": lexicon is not None, "penalty_kind": "liblinear C" if lexicon is not None else "L2 per feature",
        "trials": [{"penalty": t["penalty"], "dev": t["dev"]} for t in trials], "penalty": best["penalty"],
        "dev": best["dev"], "seconds": round(time.time() - started, 1), "hardware": hardware(threads),
        "command": command,
    })
    save_checkpoint(out, "srformer", {**config, "salience": True, "salience_lexical": lexicon is not None},
                    weights, extras)
    return {"out": str(out), "penalty": best["penalty"], "dev": best["dev"]}


def fit_main(argv: Sequence[str]) -> int:
    from models.training.srformer import add_pair_sources, check_pair_sources, pairs_file

    parser = argparse.ArgumentParser(prog="python -m models.training.srformer_salience fit")
    parser.add_argument("checkpoint", type=Path, help="a trained SRformer checkpoint (its decoder is kept)")
    add_pair_sources(parser, "bbc-news-summary or sumpubmed folder (its train and dev splits)",
                     "the penalty is chosen here")
    parser.add_argument("--out", required=True, type=Path)
    parser.add_argument("--train-docs", type=int, default=0, help="train documents used, spread over the split "
                        "(0 = all)")
    parser.add_argument("--dev-docs", type=int, default=0, help="dev documents used for the choice (0 = all)")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--lexical", action="store_true", help="fit the head with its lexicon (module docstring)")
    parser.add_argument("--penalties", type=float, nargs="+", help="the penalties tried on dev (default: "
                        f"{PENALTIES}; with --lexical, liblinear's C: {LEXICAL_C})")
    args = parser.parse_args(list(argv))
    check_pair_sources(parser, args)
    if args.data is not None:
        train = Documents.of_split(args.data, "train", args.train_docs)
        dev = Documents.of_split(args.data, "dev", args.dev_docs)
    else:
        train = Documents.of_file(pairs_file(args.train, args), args.train_docs)
        dev = Documents.of_file(pairs_file(args.dev, args), args.dev_docs)
    command = "python -m models.training.srformer_salience fit " + " ".join(argv)
    chosen = fit_salience(args.checkpoint, args.out, train, dev, lexical=args.lexical, penalties=args.penalties,
                          threads=args.threads, command=command)
    print(json.dumps(chosen))
    return 0


if __name__ == "__main__":
    commands = {"fit": fit_main}
    if len(sys.argv) < 2 or sys.argv[1] not in commands:
        raise SystemExit(f"usage: python -m models.training.srformer_salience {{{','.join(commands)}}} ...")
    sys.exit(commands[sys.argv[1]](sys.argv[2:]))
