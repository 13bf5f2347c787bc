"""The searches: the incremental no-repeat rule, greedy, and beam search, over fake log-probabilities."""

import numpy as np

from models.decoding import NEG, BeamSearch, GreedySearch, NgramBan, banned_ids


def test_the_incremental_ngram_ban_equals_the_definition():
    rng = np.random.default_rng()
    for n in (1, 2, 3, 4):
        sequence = rng.integers(0, 4, 200).tolist()  # a small alphabet: many repeats
        ban = NgramBan(n)
        for index, token in enumerate(sequence):
            assert ban.banned() == set(banned_ids(sequence[:index], n))
            ban.push(token)


def drive(search, table):
    """Feed ``search`` log-probabilities from ``table(tokens, t)`` until it is done."""
    while not search.done:
        search.advance(table(search.tokens, search.t))
    return search.result()


def markov_table(rng, vocab, eos_column, eos_penalty=2.0):
    """A fixed random bigram model over ``vocab`` columns (last token -> log-probabilities)."""
    logits = rng.standard_normal((max(vocab) + 1, len(vocab))) * 3
    logits[:, eos_column] -= eos_penalty
    logp = logits - np.log(np.exp(logits).sum(axis=1, keepdims=True))

    def table(tokens, t):
        return logp[tokens].copy()

    return table


def test_one_beam_that_never_ends_is_greedy_and_every_search_keeps_the_no_repeat_rule():
    rng = np.random.default_rng()
    vocab = np.array([2, 5, 7, 9, 11, 13], dtype=np.int64)  # sorted ids; 2 is [SEP]
    never_ends = markov_table(rng, vocab.tolist(), eos_column=0, eos_penalty=60.0)  # [SEP] never wins
    greedy = drive(GreedySearch(bos=9, eos=2, vocab_ids=vocab, limit=12, no_repeat=2), never_ends)
    # one beam that never meets [SEP] follows the best token of every step: the greedy path
    assert drive(BeamSearch(bos=9, eos=2, vocab_ids=vocab, limit=12, no_repeat=2, beams=1), never_ends) == greedy
    assert 0 < len(greedy) <= 12
    table = markov_table(rng, vocab.tolist(), eos_column=0)
    greedy = drive(GreedySearch(bos=9, eos=2, vocab_ids=vocab, limit=12, no_repeat=2), table)
    assert all(token in vocab and token != 2 for token in greedy) and len(greedy) <= 12

    wide = drive(BeamSearch(bos=9, eos=2, vocab_ids=vocab, limit=12, no_repeat=2, beams=4), table)
    for sequence in (greedy, wide):
        for index in range(len(sequence)):
            assert sequence[index] not in banned_ids(sequence[:index], 2)


def test_padded_columns_past_the_vocabulary_are_never_chosen():
    vocab = np.array([2, 3, 4], dtype=np.int64)
    search = GreedySearch(bos=1, eos=2, vocab_ids=vocab, limit=3, no_repeat=0)
    logp = np.array([[-5.0, -1.0, -3.0, 0.0, 0.0]])  # two padded columns with a higher value
    search.advance(logp)
    assert search.sequence == [3]
    logp = np.array([[NEG, -1.0, -0.5, 0.0]])
    search.advance(logp)
    assert search.sequence == [3, 4]


def test_a_minimum_length_keeps_the_end_token_out_until_it_is_reached():
    vocab = np.array([2, 5, 7], dtype=np.int64)  # 2 is [SEP], the decoder's favourite from the first step

    def wants_to_end(tokens, t):
        logp = np.log(np.full((len(tokens), 3), 0.05))
        logp[:, 0] = np.log(0.9)
        return logp

    assert drive(GreedySearch(bos=9, eos=2, vocab_ids=vocab, limit=12, no_repeat=0), wants_to_end) == []
    for min_length in (1, 4, 12):
        greedy = drive(GreedySearch(bos=9, eos=2, vocab_ids=vocab, limit=12, no_repeat=0, min_length=min_length),
                       wants_to_end)
        beam = drive(BeamSearch(bos=9, eos=2, vocab_ids=vocab, limit=12, no_repeat=0, beams=3,
                                min_length=min_length), wants_to_end)
        assert len(greedy) == min_length and 2 not in greedy  # ends as soon as [SEP] is allowed
        assert len(beam) >= min_length and 2 not in beam  # a longer hypothesis may score higher per token
    # a minimum past the length cap is the cap
    assert len(drive(GreedySearch(bos=9, eos=2, vocab_ids=vocab, limit=3, no_repeat=0, min_length=50),
                     wants_to_end)) == 3
