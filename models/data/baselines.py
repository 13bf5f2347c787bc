"""Extractive baselines a summarizer has to beat: Lead-k, a lead of a given length, and a supervised
sentence extractor (TF-IDF + logistic regression), the peer a user would pick instead of a trained model.

All of them return source sentences (:func:`models.sentences.sentences`) joined by one space, in the
document's order. "Of a given length" means the shortest run of sentences whose word count
(:func:`models.data.summary_quality.words`) reaches the target, so a baseline is never shorter than the
summary it stands beside, and at most one sentence longer.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Callable, Sequence

import numpy as np

from models.data.summary_quality import contains_sentence, verbatim_sentences, words
from models.sentences import sentences


def lead(document: str, k: int) -> str:
    """Lead-k: the first ``k`` sentences."""
    return " ".join(sentences(document)[:k])


def _take_until(parts: Sequence[str], order: Sequence[int], target_words: int) -> list[int]:
    """Indices from ``order``, in that order, until their words reach ``target_words`` (none for 0)."""
    taken: list[int] = []
    count = 0
    for index in order:
        if count >= target_words:
            break
        taken.append(index)
        count += len(words(parts[index]))
    return taken


def lead_of_length(document: str, target_words: int) -> str:
    """The first sentences of ``document`` until ``target_words`` words are reached (all of it if shorter)."""
    parts = sentences(document)
    return " ".join(parts[i] for i in _take_until(parts, range(len(parts)), target_words))


# ---- labels for the extractor ----------------------------------------------------------------------------


def _grams(tokens: Sequence[str], n: int) -> Counter[tuple[str, ...]]:
    return Counter(tuple(tokens[i : i + n]) for i in range(len(tokens) - n + 1))


def _lowered_words(text: str) -> list[str]:
    return [word.lower() for word in words(text)]


def _f1(overlap: int, produced: int, wanted: int) -> float:
    return 2 * overlap / (produced + wanted) if overlap else 0.0  # 2PR / (P + R)


def greedy_oracle(parts: Sequence[str], reference: str,
                  tokenize: Callable[[str], list[str]] = _lowered_words, up_to_length: bool = True) -> list[int]:
    """Sentence indices chosen greedily to raise ROUGE-1 F + ROUGE-2 F against ``reference`` (plain n-gram
    counts of ``tokenize``'s tokens, no stemming: Nallapati et al. 2017's labelling), stopping when no sentence
    raises it or (``up_to_length``) once the choice has the reference's length. Overlaps are updated per
    candidate's own n-grams only."""
    reference_tokens = tokenize(reference)
    if not reference_tokens:
        return []
    tokens = [tokenize(part) for part in parts]
    wanted = [_grams(reference_tokens, n) for n in (1, 2)]
    wanted_total = [sum(counter.values()) for counter in wanted]
    # each sentence's n-grams that the reference has, and its n-gram count
    useful = [[{g: c for g, c in _grams(sentence, n).items() if g in wanted[n - 1]} for n in (1, 2)]
              for sentence in tokens]
    sizes = [[max(len(sentence) - n + 1, 0) for n in (1, 2)] for sentence in tokens]
    have: list[Counter[tuple[str, ...]]] = [Counter(), Counter()]
    overlap, predicted, best = [0, 0], [0, 0], 0.0
    chosen: list[int] = []

    def gain(index: int, n: int) -> int:
        counts, limit = have[n - 1], wanted[n - 1]
        return sum(min(counts[g] + c, limit[g]) - min(counts[g], limit[g]) for g, c in useful[index][n - 1].items())

    while not up_to_length or sum(len(tokens[i]) for i in chosen) < len(reference_tokens):
        candidate, candidate_score = -1, best
        for index in range(len(parts)):
            if index in chosen or not tokens[index]:
                continue
            score = sum(_f1(overlap[n - 1] + gain(index, n), predicted[n - 1] + sizes[index][n - 1],
                            wanted_total[n - 1]) for n in (1, 2))
            if score > candidate_score:
                candidate, candidate_score = index, score
        if candidate < 0:
            break
        for n in (1, 2):
            overlap[n - 1] += gain(candidate, n)
            predicted[n - 1] += sizes[candidate][n - 1]
            have[n - 1].update(useful[candidate][n - 1])
        chosen.append(candidate)
        best = candidate_score
    return sorted(chosen)


def sentence_labels(parts: Sequence[str], reference: str) -> list[int]:
    """1 for a sentence that belongs in the summary. An extractive reference (at least half its sentences
    found in the document, as BBC's are): the sentences it contains. Otherwise (an abstract): the greedy
    ROUGE oracle."""
    document = "\n".join(parts)
    _, found, total = verbatim_sentences(reference, document)
    if total and found * 2 >= total:
        labels = [int(bool(words(part)) and contains_sentence(reference, part, ignore_case=True)) for part in parts]
        if any(labels):
            return labels
    chosen = set(greedy_oracle(parts, reference))
    return [int(i in chosen) for i in range(len(parts))]


# ---- the extractor ---------------------------------------------------------------------------------------


class SentenceExtractor:
    """A supervised sentence extractor: TF-IDF of each sentence, plus its position and length and its
    TF-IDF similarity to the whole document, into a logistic regression that says whether the sentence is in
    the summary (:func:`sentence_labels`). It picks sentences by that probability until the requested length
    and writes them in document order (scikit-learn; fitted in seconds on BBC's training split)."""

    def __init__(self, max_features: int = 50_000, c: float = 1.0) -> None:
        from sklearn.feature_extraction.text import TfidfVectorizer
        from sklearn.linear_model import LogisticRegression

        self.vectorizer = TfidfVectorizer(lowercase=True, sublinear_tf=True, min_df=2, max_features=max_features)
        self.classifier = LogisticRegression(C=c, solver="liblinear")

    def _features(self, parts: Sequence[str]) -> object:
        from scipy.sparse import csr_matrix, hstack

        tfidf = self.vectorizer.transform(parts)  # (sentences, vocabulary), rows L2-normalised
        centroid = np.asarray(tfidf.sum(axis=0)).ravel()
        norm = math.sqrt(float(centroid @ centroid))
        similarity = tfidf @ (centroid / norm) if norm else np.zeros(len(parts))
        count = len(parts)
        dense = np.array([[i / count, 1.0 / (i + 1), float(i == 0), math.log1p(len(words(part))), similarity[i]]
                          for i, part in enumerate(parts)])  # (sentences, 5)
        return hstack([tfidf, csr_matrix(dense)]).tocsr()

    def fit(self, documents: Sequence[str], references: Sequence[str]) -> SentenceExtractor:
        from scipy.sparse import vstack
        from threadpoolctl import threadpool_limits

        split = [sentences(document) for document in documents]
        labels = [label for parts, reference in zip(split, references, strict=True)
                  for label in sentence_labels(parts, reference)]
        if len(set(labels)) < 2:
            raise ValueError("the extractor needs training sentences both in and out of the summaries")
        self.vectorizer.fit([part for parts in split for part in parts])
        with threadpool_limits(1):  # one core: many-threaded BLAS only spins on a shared machine
            features = vstack([self._features(parts) for parts in split if parts])
            self.classifier.fit(features, np.array(labels))
        return self

    def probabilities(self, parts: Sequence[str]) -> np.ndarray:
        """(sentences,) probability that each sentence is in the summary."""
        from threadpoolctl import threadpool_limits

        if not parts:
            return np.zeros(0)
        with threadpool_limits(1):
            return self.classifier.predict_proba(self._features(parts))[:, 1]

    def summarize(self, document: str, target_words: int) -> str:
        """The most probable sentences until ``target_words`` words are reached, in document order."""
        parts = sentences(document)
        order = np.argsort(-self.probabilities(parts), kind="stable")
        return " ".join(parts[i] for i in sorted(_take_until(parts, order.tolist(), target_words)))
