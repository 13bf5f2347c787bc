"""Fitting the salience head with its lexicon (models/training/srformer_salience.py) on small made-up tables:
the fitted weights, folded back, score sentences as the service scores them."""

import numpy as np

from models.copy_units import DocumentText
from models.minilm import load_minilm_tokenizer
from models.sentence_choice import position_features, sentence_scores
from models.training.srformer_salience import DocumentSentences, fit_lexical_head, inverse_document_frequency

TOKENIZER = load_minilm_tokenizer()
FILLER = ["the market was quiet on the day", "officials said little about the plan", "shares closed flat in London",
          "the report came out in the morning", "traders waited for more news"]


def tables(rng: np.random.Generator, count: int) -> list[DocumentSentences]:
    """Documents whose summary sentences are the ones that mention a merger; features are noise."""
    out = []
    for d in range(count):
        sentences = [f"{FILLER[i % len(FILLER)].capitalize()} {d}." for i in range(6)]
        chosen = sorted(rng.choice(6, size=2, replace=False).tolist())
        for j in chosen:
            sentences[j] = f"The merger of two banks was agreed in {d}."
        doc = DocumentText(" ".join(sentences), TOKENIZER, 10_000)
        labels = np.zeros(len(doc.spans), dtype=np.float32)
        labels[chosen] = 1.0
        features = rng.normal(size=(len(doc.spans), 8)).astype(np.float32)
        out.append(DocumentSentences(str(d), doc, features, labels, " ".join(sentences[j] for j in chosen)))
    return out


def test_the_folded_lexical_head_scores_as_the_service_does_and_learns_the_words_that_matter():
    rng = np.random.default_rng(0)
    train = tables(rng, 30)
    idf = inverse_document_frequency(train, TOKENIZER.get_vocab_size())
    w, b, p, lexicon = fit_lexical_head(train, idf, 1.0)
    merger = TOKENIZER.token_to_id("merger")
    assert lexicon.token_weight[merger] > 0.2 > 0 > lexicon.token_weight[TOKENIZER.token_to_id("quiet")]
    probabilities, labels = [], []
    for table in [*train, *tables(np.random.default_rng(1), 5)]:
        doc = table.doc
        token_logits = np.zeros(len(doc.sentence_of))
        kept = doc.sentence_of >= 0
        token_logits[kept] = (table.features @ w + b)[doc.sentence_of[kept]]
        scores = sentence_scores(doc, token_logits, p, lexicon)
        # the same score written out: head on the mean feature, position, lexical terms, mean token weight
        shares = np.array([lexicon.token_weight[doc.ids[doc.sentence_of == j]].mean() for j in range(len(doc.spans))])
        expected = (table.features @ w + b + position_features(len(doc.spans)) @ p
                    + lexicon.features(doc) @ np.array(lexicon.weights) + shares)
        assert np.allclose(scores, expected)
        assert set(np.argsort(-scores)[:2].tolist()) == set(np.nonzero(table.labels)[0].tolist())
        if table in train:
            probabilities.extend(1 / (1 + np.exp(-scores)))
            labels.extend(table.labels)
    # the standardisation folded back with its offset: probabilities as calibrated as the regression's own
    assert abs(np.mean(probabilities) - np.mean(labels)) < 0.05
