"""Step splitting and step -> token mapping, against hand-made expectations."""

from __future__ import annotations

import pytest

from grpokit.rewards.process_rewards import split_steps, step_char_ends, step_texts, step_token_ends


def ids_of(tok, text):
    return tok(text, add_special_tokens=False)["input_ids"]


# --- split_steps -------------------------------------------------------------------------------------


def test_split_basic_lines():
    # "17+8=25" is chars 0..6, "\n" is 7, "25*2=50" is 8..14
    assert split_steps("17+8=25\n25*2=50") == [(0, 7), (8, 15)]
    assert step_char_ends("17+8=25\n25*2=50") == [8, 15]  # first end includes its newline


def test_empty_and_blank_steps_are_skipped():
    text = "\na=1\n\n\n  \nb=2"
    # steps: "a=1" at 1..4, then "" "" "  " skipped, "b=2" at 10..13
    assert split_steps(text) == [(1, 4), (10, 13)]
    assert step_texts(text) == ["a=1", "b=2"]
    assert step_char_ends(text) == [5, 13]
    assert split_steps("") == [] and split_steps("\n\n") == []


def test_trailing_delimiter_makes_no_extra_step():
    assert split_steps("a=1\nb=2\n") == [(0, 3), (4, 7)]
    assert step_char_ends("a=1\nb=2\n") == [4, 8]


def test_truncated_mid_step_keeps_partial_last_step():
    text = "17+8=25\n25*2=5"  # generation stopped inside "25*2=50"
    assert split_steps(text) == [(0, 7), (8, 14)]
    assert step_char_ends(text) == [8, 14]


def test_multi_character_step_tag():
    text = "a=1<step>b=2<step>c"
    assert step_texts(text, "<step>") == ["a=1", "b=2", "c"]
    assert step_char_ends(text, "<step>") == [9, 18, 19]


def test_empty_delimiter_rejected():
    with pytest.raises(ValueError, match="delimiter"):
        split_steps("abc", "")


# --- step_token_ends: character tokenizer --------------------------------------------------------------


def test_token_ends_char_tokenizer_with_eos(char_tok):
    text = "17+8=25\n25*2=50\n<answer>50</answer>"
    ids = [*ids_of(char_tok, text), char_tok.eos_token_id]
    # tokens 0..7 = "17+8=25\n", 8..15 = "25*2=50\n", 16 "<answer>", 17 "5", 18 "0", 19 "</answer>", 20 EOS
    assert len(ids) == 21
    assert step_token_ends(text, ids, char_tok) == [7, 15, 19]  # never the EOS


def test_token_ends_truncated_mid_step(char_tok):
    text = "17+8=25\n25*2=5"
    ids = ids_of(char_tok, text)  # 14 tokens, no EOS
    assert step_token_ends(text, ids, char_tok) == [7, 13]  # partial last step ends at the last token


def test_token_ends_empty_steps_and_trailing_delimiter(char_tok):
    text = "1+1=2\n\n2+1=3\n"
    ids = [*ids_of(char_tok, text), char_tok.eos_token_id]
    # "1+1=2\n" tokens 0..5, "\n" token 6 (empty step, skipped), "2+1=3\n" tokens 7..12
    assert step_token_ends(text, ids, char_tok) == [5, 12]


def test_token_ends_step_tag_token(char_tok):
    text = "a=1<step>b=2<step>"
    ids = ids_of(char_tok, text)
    # "a","=","1" 0..2, "<step>" 3 (one added token), "b","=","2" 4..6, "<step>" 7
    assert len(ids) == 8
    assert step_token_ends(text, ids, char_tok, delimiter="<step>") == [3, 7]


def test_no_steps_gives_empty(char_tok):
    assert step_token_ends("\n\n", ids_of(char_tok, "\n\n"), char_tok) == []
    assert step_token_ends("", [char_tok.eos_token_id], char_tok) == []


# --- step_token_ends: tokens straddling step boundaries -------------------------------------------------


def test_step_ending_mid_token(merge_tok):
    text = "17+8=25\n25*2=50"
    ids = ids_of(merge_tok, text)
    pieces = [merge_tok.decode([i]) for i in ids]
    # merge ranks: "5"+"\n" first, then "5\n"+"2", so the canonical encoding has a token "5\n2" holding the
    # end of step 1 (its newline) and the start of step 2:
    assert pieces == ["1", "7", "+", "8", "=", "2", "5\n2", "5", "*", "2", "=", "5", "0"]
    assert step_token_ends(text, ids, merge_tok) == [6, 12]  # step 1 ends inside token 6
    # The same with a different prefix. Step 1 ends in token 5 ("5\n2"); step 2 in the last token.
    vocab = merge_tok.get_vocab()
    ids = [vocab[c] for c in ["1", "+", "1", "=", "2", "5\n2", "5", "*", "2", "=", "5", "0"]]
    text = merge_tok.decode(ids)
    assert text == "1+1=25\n25*2=50"
    assert step_token_ends(text, ids, merge_tok) == [5, 11]


def test_two_steps_ending_in_one_token(merge_tok):
    vocab = merge_tok.get_vocab()
    ids = [vocab[c] for c in ["1", "=", "5\n", "5\n", "0"]]  # "1=5\n5\n0"
    text = merge_tok.decode(ids)
    # steps "1=5" (ends at token 2, its "\n"), "5" (ends at token 3), "0" (token 4)
    assert step_token_ends(text, ids, merge_tok) == [2, 3, 4]


def test_non_canonical_ids_fall_back_to_decoding(merge_tok):
    vocab = merge_tok.get_vocab()
    pieces = ["1", "7", "=", "2", "5", "\n", "2", "5", "*", "2"]  # "25" sampled as "2","5" (not canonical)
    ids = [vocab[p] for p in pieces]
    text = merge_tok.decode(ids)
    assert ids != ids_of(merge_tok, text)
    assert step_token_ends(text, ids, merge_tok) == [5, 9]


def test_text_differing_from_decoding_is_aligned(char_tok):
    ids = ids_of(char_tok, "  17+8=25\n25*2=50\n")
    # the caller stripped the text: steps are found in the stripped text, mapped onto the decoded tokens
    assert step_token_ends("17+8=25\n25*2=50", ids, char_tok) == [9, 16]


def test_sentencepiece_style_non_canonical_ids():
    """Metaspace (SentencePiece-style) decoding drops a word's leading space when a token is decoded alone,
    so token-by-token lengths do not add up; the windowed incremental decoding still finds the ends."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    backend = Tokenizer(models.BPE(unk_token="<unk>"))
    backend.pre_tokenizer = pre_tokenizers.Metaspace()
    backend.decoder = decoders.Metaspace()
    trainer = trainers.BpeTrainer(vocab_size=120, special_tokens=["<unk>", "</s>"])
    backend.train_from_iterator(["the cat sat on the mat\nthen it ran away\n"] * 10, trainer)
    tok = PreTrainedTokenizerFast(tokenizer_object=backend, eos_token="</s>")
    vocab = tok.get_vocab()
    pieces = ["▁the", "▁", "c", "a", "t", "\n", "s", "a", "t", "</s>"]  # "▁cat" spelled out, "sat" too
    ids = [vocab[p] for p in pieces]
    text = tok.decode(ids, skip_special_tokens=True)
    assert text == "the cat\nsat"
    # "the cat\n" ends at the "\n" (token 5); "sat" at its last character (token 8), not the EOS
    assert step_token_ends(text, ids, tok) == [5, 8]


def test_byte_level_character_split_over_two_tokens():
    """Byte-level BPE can sample a two-byte character as two tokens; each decodes alone to U+FFFD."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    backend = Tokenizer(models.BPE())
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    backend.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=300, special_tokens=["<eos>"], initial_alphabet=pre_tokenizers.ByteLevel.alphabet()
    )
    backend.train_from_iterator(["é\na=1\n"] * 10, trainer)
    tok = PreTrainedTokenizerFast(tokenizer_object=backend, eos_token="<eos>")
    ids = tok.convert_tokens_to_ids(["Ã", "©", "Ċ", "a", "=", "1"])  # "é" as its two bytes, "\n", "a=1"
    text = tok.decode(ids)
    assert text == "é\na=1"
    assert step_token_ends(text, ids, tok) == [2, 5]
