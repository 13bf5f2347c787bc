"""Sentence copy and the document's letter case (models/copy_units.py, models/sentence_choice.py,
models/letter_case.py), without a model."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from models.copy_units import DocumentText, is_name_list, note_lines
from models.decoding import BeamSearch, GreedySearch
from models.detokenize import Detokenizer
from models.letter_case import DocumentCase
from models.minilm import load_minilm_tokenizer
from models.sentence_choice import (
    Lexicon,
    choose_sentences,
    copy_sentences,
    leans_on,
    lexical_features,
    sentence_scores,
)

TOKENIZER = load_minilm_tokenizer()

WORDS = ["bank", "rose", "Monday", "profits", "BBC", "NATO", "said", "the", "£1.3bn", "5.2%", "Mr.", "U.S.",
         "it's", "Café", "growth", "year-earlier", "\"quoted\"", "(up", "3)", "analysts", "warned", "e.g.", "lending"]


@st.composite
def documents(draw):
    sentences = []
    for _ in range(draw(st.integers(1, 12))):
        words = draw(st.lists(st.sampled_from(WORDS), min_size=1, max_size=18))
        end = draw(st.sampled_from([".", "!", "?", "", ".\""]))
        sentences.append(words[0][:1].upper() + words[0][1:] + " " + " ".join(words[1:]) + end)
    glue = draw(st.lists(st.sampled_from([" ", "  ", "\n", "\n\n", ""]), min_size=len(sentences),
                         max_size=len(sentences)))
    return "".join(s + g for s, g in zip(sentences, glue, strict=True))


def random_lexicon(rng: np.random.Generator) -> Lexicon:
    vocab = TOKENIZER.get_vocab_size()
    return Lexicon(rng.normal(size=vocab), rng.uniform(1, 5, size=vocab), tuple(rng.normal(size=2).tolist()))


@settings(max_examples=40, deadline=None)
@given(text=documents(), seed=st.integers(0, 2**31), target=st.integers(1, 300), fraction=st.floats(0.1, 1.0),
       with_lexicon=st.booleans())
def test_every_copied_sentence_is_a_substring_of_the_source(text, seed, target, fraction, with_lexicon):
    rng = np.random.default_rng(seed)
    total = len(TOKENIZER.encode(text, add_special_tokens=False).ids)
    read = max(1, int(total * fraction))
    logits = rng.normal(size=total).astype(np.float32)
    lexicon = random_lexicon(rng) if with_lexicon else None
    copied = copy_sentences(text, TOKENIZER, logits, read, rng.normal(size=3).tolist(), target, lexicon=lexicon)
    normalised = " ".join(text.split())
    at = -1
    for sentence, tokens in copied:
        first = next(i for i, ch in enumerate(sentence) if ch.isalnum())  # the one letter copy may capitalise
        found = max(normalised.find(form, at + 1) for form in (
            sentence, sentence[:first] + sentence[first].lower() + sentence[first + 1:]))
        assert found > at, (sentence, text)  # a substring, and after the one before: the document's order
        at = found
        assert tokens > 0


CASE_DOCUMENT = (
    "BBC chief Greg Dyke met NATO officials in Brussels on 3 May. The BBC said Dyke's talks with NATO were "
    "useful. Sales at Café Rouge rose 5.2% to £1.3bn in 2004, the U.S. firm iPod Inc said. Analysts expect "
    "growth. Apple shares rose 12p."
)


def test_case_restoration_is_exact_on_names_acronyms_and_numbers():
    detokenizer = Detokenizer(TOKENIZER)
    generated = ("bbc chief greg dyke met nato officials in brussels. sales at cafe rouge rose 5. 2 % to "
                 "£1. 3bn in 2004, ipod inc said. apple shares rose 12p.")
    ids = TOKENIZER.encode(generated, add_special_tokens=False).ids
    text = detokenizer.text(ids, case=DocumentCase(CASE_DOCUMENT))
    assert text == ("BBC chief Greg Dyke met NATO officials in Brussels. Sales at Café Rouge rose 5.2% to £1.3bn in "
                    "2004, iPod Inc said. Apple shares rose 12p.")


def test_uncased_documents_get_capitalised_sentence_starts_only():
    document = "the gene flow was high in bt rice  <cit> . farmers grow gm crops. yields rose by  <dig> %."
    ids = TOKENIZER.encode("the gene flow was high. yields rose by < dig > %.", add_special_tokens=False).ids
    text = Detokenizer(TOKENIZER).text(ids, case=DocumentCase(document))
    assert text == "The gene flow was high. Yields rose by <dig>%."


def test_a_sentence_cut_by_the_reading_limit_is_not_copied():
    text = "First sentence is here. Second one is longer than that. Third one is cut by the limit here."
    total = len(TOKENIZER.encode(text, add_special_tokens=False).ids)
    doc = DocumentText(text, TOKENIZER, total - 3)
    assert [doc.sentence(j) for j in range(len(doc.spans))] == ["First sentence is here.",
                                                               "Second one is longer than that."]
    assert doc.tokens.sum() == (doc.sentence_of >= 0).sum() and doc.tokens.tolist() == [5, 7]


def test_sentences_are_taken_while_they_bring_the_length_nearer_its_target():
    text = ("Alpha beta gamma delta epsilon. One two three four five six seven eight nine ten eleven twelve. "
            "Short one here too. A sentence of middle length is here.")
    doc = DocumentText(text, TOKENIZER, 10_000)
    sizes = doc.tokens.tolist()
    scores = np.array([0.0, 3.0, 2.0, 1.0])
    assert choose_sentences(doc, scores, sizes[0]) == [0]  # the opening unit first, whatever its score
    assert choose_sentences(doc, scores, sizes[0] + sizes[1]) == [0, 1]
    assert choose_sentences(doc, scores, sizes[0] + sizes[1] + sizes[2]) == [0, 1, 2]  # in the document's order
    assert sizes[3] > sizes[2]
    prefers_3 = np.array([0.0, 3.0, 1.0, 2.0])  # 3 scores above 2, but only 2 fits beside 0 and 1 under the limit
    assert choose_sentences(doc, prefers_3, 10_000, limit_tokens=sizes[0] + sizes[1] + sizes[2]) == [0, 1, 2]
    z = sentence_scores(doc, np.zeros(len(doc.sentence_of)), [0.0, 1.0, 0.0])
    assert np.argmax(z) == 0  # the position term alone: the first sentence


def test_a_unit_that_leans_on_another_brings_it_and_a_repeat_is_passed_over():
    units = ["Ken Livingstone said he would not apologise.",  # 0 introduces Livingstone
             "The Standards Board is looking into the matter.",  # 1
             "It has the power to suspend the mayor.",  # 2 leans on 1 ("It")
             "Mr Livingstone called the remarks fair comment.",  # 3 leans on 0 (the surname alone, titled)
             "Livingstone told reporters on Monday he stood by them.",  # 4 leans on 0 (the surname alone)
             "However, Labour leaders disagreed with him.",  # 5 leans on 4 (a connective)
             '"It was wrong," he said.',  # 6 leans on 5 (a pronoun opens it, and speaks)
             "For example, Tony Blair asked him to say sorry.",  # 7 leans on 6 (a connective phrase)
             "Tony Blair urged Mr Livingstone to say sorry.",  # 8 names Livingstone after a title: leans on 0
             '"We will not back down on this."',  # 9 a quotation naming no speaker: the speaker of 8's
             '"It is over," Ken Livingstone told reporters.']  # 10 names its speaker
    assert leans_on(units) == [set(), set(), {1}, {0}, {0}, {4}, {5}, {6}, {0}, {8}, set()]
    assert leans_on(["the yield rose by a third.", "therefore the gene was kept.", "the plots were small."]) == [
        set(), {0}, set()]  # lower-cased text: no names to follow, connectives still count
    text = ("Opening words of a story here today. A second sentence that says little at all. "
            "The Standards Board is looking into the comments. It has the power to suspend the mayor of the city. "
            "The Standards Board is looking into the remarks.")
    doc = DocumentText(text, TOKENIZER, 10_000)
    sizes = doc.tokens.tolist()
    scores = np.array([0.0, 1.0, -5.0, 9.0, 8.0])  # 3 scores highest, 2 (which it leans on) lowest
    assert choose_sentences(doc, scores, sizes[0] + sizes[2] + sizes[3]) == [0, 2, 3]
    # 4 repeats 2: passed over, although it scores above 1 and would bring the length nearer
    assert choose_sentences(doc, scores, sum(sizes) - sizes[1]) == [0, 1, 2, 3]
    # a title introduces "Nigerian" and "Trust"; the first sentence, which names them alone, is still taken
    titled = DocumentText("Two Nigerian banks set to merge\n\nNigerian banks Standard Trust and United Bank plan to "
                          "merge. Trust staff were told on Monday by the chairman.", TOKENIZER, 10_000)
    assert leans_on([titled.text[a:b] for a, b in titled.spans])[1] == {0}
    assert choose_sentences(titled, np.array([9.0, 0.0, 1.0]), int(titled.tokens[1])) == [1]


def test_a_quotation_run_over_lines_is_copied_to_its_close():
    text = ('The committee reported on Monday.\n'
            'Its chairman said: "Each death in custody is one too many.\n'
            '"Yet we have seen vulnerable people enter custody time and again."\n'
            'The committee also highlighted cases of children.')
    doc = DocumentText(text, TOKENIZER, 10_000)
    units = [doc.text[a:b] for a, b in doc.spans]
    assert len(units) == 4
    assert leans_on(units) == [set(), {0, 2}, {1}, set()]  # the opening line needs the line that closes its quote
    scores = np.array([0.0, 9.0, -5.0, 1.0])  # the closing line scores lowest: it comes with the opening one
    assert choose_sentences(doc, scores, int(doc.tokens[:3].sum())) == [0, 1, 2]
    fits_one_line = int(doc.tokens[:2].sum()) + 2  # the run does not fit under the limit: never cut
    assert choose_sentences(doc, scores, fits_one_line, limit_tokens=fits_one_line) == [0, 3]


def test_adjacency_ranks_a_unit_next_to_one_taken_above_a_better_scored_one_apart():
    text = ("The first unit opens the summary here. The second unit follows the first one closely. "
            "A third unit sits in the middle of the text. The fourth unit stands far from the opening.")
    doc = DocumentText(text, TOKENIZER, 10_000)
    scores = np.array([0.0, 1.0, -1.0, 2.0])
    target = int(doc.tokens[0] + doc.tokens[1])
    assert choose_sentences(doc, scores, target) == [0, 3]  # by score alone
    assert choose_sentences(doc, scores, target, adjacency=0.1) == [0, 3]  # a small pull does not beat 1 point
    assert choose_sentences(doc, scores, target, adjacency=1.0) == [0, 1]  # a standard deviation (1.12) of pull does


def test_trigram_overlap_passes_over_a_unit_that_repeats_the_summary_s_phrases():
    text = ("Renal cortical echogenicity was measured in dogs and cats. "
            "We found that renal cortical echogenicity in dogs and cats rose steadily with age and weight. "
            "Kidney size was recorded for every animal in the clinic.")
    doc = DocumentText(text, TOKENIZER, 10_000)
    scores = np.array([0.0, 2.0, 1.0])
    target = int(doc.tokens[0] + doc.tokens[1])
    # 3 of the second unit's 14 trigrams are in the first ("renal cortical echogenicity", "in dogs and", "dogs and
    # cats"), and half its content words are new, so only the trigram rule passes it over
    assert choose_sentences(doc, scores, target) == [0, 1]
    assert choose_sentences(doc, scores, target, trigram_overlap=0.5) == [0, 1]
    assert choose_sentences(doc, scores, target, trigram_overlap=0.2) == [0, 2]


def test_searches_end_at_the_first_sentence_end_past_the_target():
    vocab = np.array([5, 6, 7, 102], dtype=np.int64)  # 7 ends a sentence, 102 is eos
    steps = {0: 0, 1: 2, 2: 0, 3: 2}  # the best column per step: word, end, word, end

    greedy = GreedySearch(101, 102, vocab, limit=20, no_repeat=0, ends=frozenset({7}), target=3)
    while not greedy.done:
        row = np.full((1, 4), -10.0)
        row[0, steps[greedy.t % 4]] = 0.0
        greedy.advance(row)
    assert greedy.result() == [5, 7, 5, 7]  # the end at 2 tokens is before the target; the one at 4 ends it
    beam = BeamSearch(101, 102, vocab, limit=20, no_repeat=0, beams=2, ends=frozenset({7}), target=3)
    while not beam.done:
        probabilities = np.full((2, 4), 0.02)
        probabilities[:, steps[beam.t % 4]] = 0.94
        beam.advance(np.log(probabilities))
    assert beam.result()[-1] == 7 and len(beam.result()) >= 3


def test_a_running_quotation_is_one_copy_unit_and_titles_are_never_copied():
    text = ('Wright-Phillips to start\n\nEriksson replied: "I could tell you yes. "It\'s a blow that four are away. '
            '"On the other hand it\'s good." The England coach said so today. He was asked about it.')
    doc = DocumentText(text, TOKENIZER, 10_000)
    units = [doc.sentence(j) for j in range(len(doc.spans))]
    assert units == ["Wright-Phillips to start",
                     'Eriksson replied: "I could tell you yes. "It\'s a blow that four are away. "On the other hand '
                     'it\'s good."', "The England coach said so today.", "He was asked about it."]
    assert [doc.copyable(j) for j in range(len(units))] == [False, True, True, True]
    title_first = np.array([9.0, 0.0, 0.0, 0.0])
    assert 0 not in choose_sentences(doc, title_first, 10)  # the title scores highest, and is not a sentence


LEXICAL_DOCUMENT = ("Oil prices rose sharply on Monday. Oil traders said prices rose on supply fears. "
                    "The weather was mild in Paris. Traders expect oil prices to stay high.")


def test_centrality_is_the_idf_weighted_cosine_with_the_rest_of_the_document():
    doc = DocumentText(LEXICAL_DOCUMENT, TOKENIZER, 10_000)
    idf = np.random.default_rng(0).uniform(1, 4, size=TOKENIZER.get_vocab_size())
    features = lexical_features(doc, idf)
    document = np.bincount(doc.ids, minlength=len(idf)).astype(float)
    for j in range(len(doc.spans)):
        own = np.bincount(doc.ids[doc.sentence_of == j], minlength=len(idf)).astype(float)
        f_j, rest = own * idf, (document - own) * idf
        assert features[j, 0] == pytest.approx(f_j @ rest / np.linalg.norm(f_j) / np.linalg.norm(rest))
        assert features[j, 1] == pytest.approx(np.log1p(doc.tokens[j]))
    assert np.argmin(features[:, 0]) == 2  # the weather shares no content word with the oil story


def test_a_lexicon_adds_its_token_weights_and_sentence_terms_to_the_score():
    doc = DocumentText(LEXICAL_DOCUMENT, TOKENIZER, 10_000)
    vocab = TOKENIZER.get_vocab_size()
    logits = np.zeros(len(doc.sentence_of))
    plain = sentence_scores(doc, logits, [0.0, 0.0, 0.0])
    weather = TOKENIZER.token_to_id("weather")
    token_weight = np.zeros(vocab)
    token_weight[weather] = 6.0
    lexicon = Lexicon(token_weight, np.ones(vocab), (0.0, 0.0))
    scored = sentence_scores(doc, logits, [0.0, 0.0, 0.0], lexicon)
    assert scored[2] - plain[2] == pytest.approx(6.0 / doc.tokens[2])  # the mean of a_t + v_x over the sentence
    assert np.allclose(np.delete(scored, 2), np.delete(plain, 2))
    central = Lexicon(np.zeros(vocab), np.ones(vocab), (5.0, 0.0))
    assert np.argmin(sentence_scores(doc, logits, [0.0, 0.0, 0.0], central)) == 2  # the least central


def test_a_list_of_names_is_not_a_copy_unit_but_a_sentence_that_lists_is():
    line_up = "Phillips, Amankwaah, Coles, Hill, Fortune, Murray (Anyinsah 59), Doherty (Harley 45), Dinning, Bell."
    replacements = ("Replacements: A Titterrell (Sale Sharks), P Vickery (Gloucester), S Borthwick (Bath), "
                    "J Forrester (Gloucester), H Ellis (Leicester).")
    listing = ("They were the British Potato Council, the Milk Development Council, the Energy Savings Trust, "
               "Agricultural Wages Committees and the Wine Standards Board.")
    assert is_name_list(line_up) and is_name_list(replacements) and is_name_list("Subs Not Used: Orr, Brown.")
    assert not is_name_list(listing) and not is_name_list("Smith, Jones and Brown scored, as did Green, White.")
    doc = DocumentText(f"Wales beat Italy on Sunday. {line_up} The coach was pleased with the win.", TOKENIZER, 10_000)
    assert [doc.copyable(j) for j in range(len(doc.spans))] == [True, False, True]


def test_captions_legends_footnotes_garbled_units_back_matter_and_pointers_to_tables_are_not_copied():
    uncased = ("the enzyme was purified from petals and assayed at several ph values. scale bar: 10 mm. "
               "short ) non-coding rnas perform many functions in the cell nucleus. table  <dig> shows the "
               "distribution of the toxinotypes among the isolates we collected. for known disease associations. "
               "the activity was highest at ph  <dig> in every cultivar that we tested.")
    doc = DocumentText(uncased, TOKENIZER, 10_000)
    assert doc.uncased
    assert [doc.copyable(j) for j in range(len(doc.spans))] == [True, False, False, False, False, True]
    cased = ("He scored twice for Wales. Wales won (the first time since 2003. Figure 2 shows the score by half. "
             "It rained all day long.")
    doc = DocumentText(cased, TOKENIZER, 10_000)
    assert not doc.uncased  # a sentence of five words is copyable in cased text
    assert [doc.copyable(j) for j in range(len(doc.spans))] == [True, False, False, True]
    legend = ("the mic values for the antimicrobial agents obtained from the isolates are shown. the strain was "
              "most sensitive to cefotaxime of all the agents we tested. a retrospective of the early studies on "
              "the strain was shown.")  # the past tense tells what happened, not where to look
    doc = DocumentText(legend, TOKENIZER, 10_000)
    assert [doc.copyable(j) for j in range(len(doc.spans))] == [False, True, True]
    marks = ("cnvs confirmed in this study or in the literature are indicated in yellow. the vertical bars "
             "denote the standard error of the mean. the red line indicates the threshold we used for calling. "
             "lines of evidence indicate that the mutant line shows more growth in the dark.")
    doc = DocumentText(marks, TOKENIZER, 10_000)  # a legend's marks; prose with "lines" and "shows"
    assert [doc.copyable(j) for j in range(len(doc.spans))] == [False, False, False, True]
    keys = ("cnv, copy-number variation; herv, human endogenous retrovirus; ltr, long tandem repeat. the "
            "reads were mapped in pairs; however, the unpaired reads were kept for the second pass of the run.")
    doc = DocumentText(keys, TOKENIZER, 10_000)  # a legend's key of abbreviations; a sentence with a semicolon
    assert [doc.copyable(j) for j in range(len(doc.spans))] == [False, True]
    back = ("the portal software may be downloaded from the public source code repository of the project. "
            "operating system: both portal and clients are platform independent of each other. smw led the "
            "development of the linked dataset and drafted the manuscript. all authors read and approved the final "
            "manuscript. we designed the study to test the portal on the operating system of each client.")
    doc = DocumentText(back, TOKENIZER, 10_000)  # back matter: a software note's fields, authors' contributions
    assert [doc.copyable(j) for j in range(len(doc.spans))] == [True, False, False, False, True]


def test_a_tables_notes_are_not_copied_but_prose_that_opens_like_one_is():
    text = ("the docking runs recovered the bound conformation of the receptor in most test cases.\n"
            "1backbone atom distance between interface residues in the bound and unbound structures.\n"
            "2docking difficulty, based on the extent of the conformational changes on binding.\n"
            "a gene name, accession number and protein name were obtained from the proteomics server.\n"
            "b theoretical values of pi and mw were calculated with the tool of the same server.\n"
            "a study by an earlier group of soybean nodules showed elevated expression of the enzyme.\n"
            "1 of the cultivars we tested showed no activity at any of the ph values we used.")
    assert [text[a:b].split()[0] for a, b in note_lines(text)] == ["1backbone", "2docking", "a", "b"]
    doc = DocumentText(text, TOKENIZER, 10_000)
    # notes run in order: "a study" after note b, and a lone "1 of the", are prose
    assert [doc.copyable(j) for j in range(len(doc.spans))] == [True, False, False, False, False, True, True]


def test_scientific_connectives_lean_on_the_unit_before():
    units = ["the kinase was cloned.", "subsequently, two dehydrogenases oxidize it.", "conversely, the mutant grew.",
             "to this end we built a vector.", "overall, the data agree.", "the assay was run at ph 7."]
    assert leans_on(units) == [frozenset(), {0}, {1}, {2}, {3}, frozenset()]


def test_a_demonstrative_before_a_noun_anywhere_in_a_unit_leans_on_the_unit_before():
    units = ["two isolates were recombinant.", "an animal model will test the virulence of these recombinants.",
             "we compared these studies with ours.", "Investors in these two firms sold shares.",
             "the yield of those strains was low.", "the assay was run at ph 7."]
    # "these studies" (a review's, or the article's own) do not point back
    assert leans_on(units) == [frozenset(), {0}, frozenset(), {2}, {3}, frozenset()]


def test_a_later_item_of_an_enumeration_or_a_pronoun_after_a_short_opening_leans_on_the_unit_before():
    units = ["three points differ from earlier trees: first, the african species is nested.",
             "second, our analyses do not support the genus.", "fourth, species of ansonia do not form a clade.",
             "next, tissues were screened.", "During cross examination, he asked Mr Myers about the books.",
             "Together, they have a broad distribution.",
             "Unveiling the slogan at the spring conference, he promised an open party.",
             "since bacteriocins are proteinaceous substances, they must be sensitive to a protease.",
             "After leaving Northern Ireland, he became a minister.", "second-placed Arsenal won."]
    # a phrase long enough to name the pronoun's antecedent does not lean; nor a capitalised word in it, nor
    # an ordinal that is not an enumeration's item
    assert leans_on(units) == [frozenset(), {0}, {1}, {2}, {3}, {4}, frozenset(), frozenset(), frozenset(),
                               frozenset()]
