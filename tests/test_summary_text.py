"""Summaries read as text: no WordPiece spacing artifacts, no words glued from pieces of different
document words, no word cut at the length cap; streamed pieces are whole words and add up to the summary.

Over 50 BBC test articles summarized by the shipped `srformer-news` (exported once here: about 15 s, the 50
summaries about 15 s on 2 cores).
"""

import asyncio
import json
import re
from pathlib import Path

import pytest

from models.detokenize import Detokenizer, WordStream, clean_spacing

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT.parent / "shared" / "data" / "bbc-news-summary"  # as tests/test_bench.py finds it
WEIGHTS = ROOT / "weights" / "srformer-news"
# what the tokenizer's decoder alone leaves: "year ' s", "us - based", "$ 1. 2871", "1, 000", "( bbc )", "5 %", " ."
ARTIFACTS = re.compile(r"\w ' \w|\w ' |\w - \w|\d[.,:] \d|[$£€] \d|\( \w|\w \)|\w [.,%!?;:]")


def test_clean_spacing_rejoins_what_bert_split():
    assert clean_spacing("the year ' s us - based unit earned $ 1. 2871 ( up 5 % ) on 1, 000 sales .") == \
        "the year's us-based unit earned $1.2871 (up 5%) on 1,000 sales."
    assert clean_spacing("the players ' union said it does n't") == "the players' union said it doesn't"


def _tokenizer():
    from tokenizers import Tokenizer

    from models.serving.rmt import tokenizer_file

    return Tokenizer.from_file(str(tokenizer_file()))


def test_words_must_come_from_the_document_and_streams_add_up():
    tokenizer = _tokenizer()
    detokenizer = Detokenizer(tokenizer)
    source = tokenizer.encode("Kilmarnock's manager, Jim Jefferies, said the US-based firm paid $1.2871m.",
                              add_special_tokens=False).ids
    known = detokenizer.vocabulary(source)
    ki, lma, eries = (tokenizer.token_to_id(piece) for piece in ("ki", "##lma", "##eries"))
    glued = [*source[:4], ki, eries, *source[4:]]  # a word made of pieces of two document words
    assert "kieries" not in detokenizer.text(glued, known) and "kieries" in tokenizer.decode(glued)
    cut = source[:-1] + [ki, lma]  # the length cap stopped inside a word
    assert not detokenizer.text(cut, known).endswith("kilma") and tokenizer.decode(cut).endswith("kilma")
    stream, pieces = WordStream(detokenizer, known), []
    for end in range(1, len(source) + 1):
        piece = stream.update(source[:end])
        if piece:
            pieces.append(piece)
    final = detokenizer.text(source, known)
    pieces.append(stream.finish(final) or "")
    assert "".join(pieces) == final == "kilmarnock's manager, jim jefferies, said the us-based firm paid $1.2871m."
    assert all(piece.startswith(" ") for piece in pieces[1:])  # word boundaries


@pytest.fixture(scope="module")
def news_repository(tmp_path_factory):
    if not (DATA / "splits.json").exists() or not (WEIGHTS / "model.safetensors").exists():
        pytest.skip("BBC data or the srformer-news weights are not here")
    from export.exporter import export_checkpoint

    repository = tmp_path_factory.mktemp("news")
    export_checkpoint(WEIGHTS, repository, formats=("onnx",))
    return repository


@pytest.fixture
async def news_model(news_repository):
    """The exported model on this test's event loop (the batchers' workers live on it)."""
    from service.runtime.registry import load_model
    from service.settings import Settings

    model = load_model(news_repository / "srformer-news" / "1", "onnx", Settings(model_repository=news_repository))
    yield model
    for batcher in model.batchers.values():
        await batcher.close()


def _words(text):
    return re.findall(r"[a-z0-9]+", text.lower())


@pytest.mark.parametrize("decoding", ["sentence", "free"])
async def test_fifty_bbc_summaries_read_as_text(news_model, decoding):
    from models.data.bbc import load_split
    from service.runtime.pipeline import run_whole

    pairs = load_split(DATA, "test")[:50]
    free = {"decoding": "free", "max_length": 17}  # capped: the decoder stops at a word boundary
    capped = [run_whole(news_model.pipeline, pair.document, options=free) for pair in pairs[:10]]
    whole = [run_whole(news_model.pipeline, pair.document, options={"decoding": decoding}) for pair in pairs]
    answers = [finished.result for _, finished in await asyncio.gather(*whole, *capped)]
    assert len(answers) == 60
    for answer, pair in zip(answers, pairs + pairs[:10], strict=True):
        summary = answer["summary"]
        assert summary
        assert summary[0].isupper() or not summary[0].isalpha()  # the document's case, not the vocabulary's
        document = set(_words(pair.document))
        assert [word for word in _words(summary) if word not in document] == []  # no glued or cut words
        if answer["decoding"] == "sentence":  # whole sentences of the article, as it writes them (its spacing too)
            flat = " ".join(pair.document.split())
            # cut after every sentence-final mark (abbreviations too): a join of two copied units is a cut
            pieces = re.split(r"(?:(?<=[.!?])|(?<=[.!?][\"')\]]))\s", summary)
            assert all(piece in flat for piece in pieces), [piece for piece in pieces if piece not in flat]
        else:  # generated: none of the tokenizer's spacing artifacts
            assert not ARTIFACTS.search(summary), ARTIFACTS.search(summary)
    assert all(answer["summary_tokens"] <= 17 for answer in answers[50:])
    assert {answer["decoding"] for answer in answers[:50]} == {decoding}


async def test_streamed_summary_is_whole_words_adding_up_to_the_summary(news_model):
    from models.data.bbc import load_split
    from service.runtime.pipeline import run_whole

    document = load_split(DATA, "test")[7].document
    _, finished = await run_whole(news_model.pipeline, document, stream=True,
                                  options={"max_length": 60, "decoding": "free"})
    pieces, result = [piece async for piece in finished.tokens], finished.result
    assert len(pieces) > 5 and "".join(pieces) == result["summary"]
    assert all(piece.startswith(" ") for piece in pieces[1:])


def test_the_export_writes_the_measured_scores_into_the_manifest(news_repository):
    manifest = json.loads((news_repository / "srformer-news" / "1" / "manifest.json").read_text())
    measured = json.loads((WEIGHTS / "metrics.json").read_text())["test"]
    assert manifest["settings"]["metrics"]["test"] == measured
    decode = json.loads((WEIGHTS / "config.json").read_text())["extras"]["decode"]
    assert manifest["settings"]["copy_adjacency"] == decode.get("adjacency", 0.0)  # sentence copy's, as chosen
    assert manifest["settings"]["copy_trigram_overlap"] == decode.get("trigram_overlap", 1.0)
    for folder in sorted(ROOT.joinpath("weights").glob("*/config.json")):  # every shipped model has its scores
        extras = json.loads(folder.read_text())["extras"]
        assert extras.get("metrics") or (folder.parent / "metrics.json").exists(), folder.parent.name
