"""axgrid.data.chat: a malformed line of a chat file is refused naming the file, the line and what is wrong; the
assistant mask covers exactly each assistant message's tokens (its end-of-turn token included) under a ChatML
template; packing puts every target in exactly one row and padding never enters the loss; the shipped instruction
set reads."""
from __future__ import annotations

import json

import pytest
import torch

from helpers.tiny_hf import tiny_llama

from axgrid.data import KJV_INSTRUCTIONS
from axgrid.data.chat import ChatFormatError, ChatRows, load_chat, read_chat_file, tokenize_chat

pytest.importorskip("transformers")

GOOD = {"messages": [{"role": "user", "content": "What is the capital of France?"},
                     {"role": "assistant", "content": "Paris."},
                     {"role": "user", "content": "And of Spain?"},
                     {"role": "assistant", "content": "Madrid is the capital of Spain."}]}


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory):
    from transformers import AutoTokenizer
    return AutoTokenizer.from_pretrained(tiny_llama(str(tmp_path_factory.mktemp("chat")), vocab=320, tokenizer=True,
                                                    chat=True))


@pytest.mark.parametrize("line, why", [
    ('{"messages": [{"role": "user", "content": "hi"}', "not valid JSON"),
    ('["a", "list"]', "must be a JSON object, not list"),
    ('{"text": "no conversation"}', 'neither "messages" nor "prompt" and "response"'),
    ('{"messages": []}', '"messages" must be a non-empty list'),
    ('{"messages": [{"role": "robot", "content": "hi"}]}', "message 1 has role 'robot'"),
    ('{"messages": [{"role": "user", "content": 3}, {"role": "assistant", "content": "x"}]}',
     "message 1's \"content\" must be a string"),
    ('{"messages": [{"role": "user", "content": "hi"}]}', "no assistant message"),
    ('{"prompt": "hi"}', '"response" must be a string and is missing'),
    ('{"prompt": "hi", "response": "yo", "score": 1}', "unexpected keys ['score']"),
])
def test_a_malformed_line_names_the_file_the_line_and_what_is_wrong(tmp_path, line, why):
    path = tmp_path / "chat.jsonl"
    path.write_text(json.dumps(GOOD) + "\n\n" + json.dumps({"prompt": "a", "response": "b"}) + "\n" + line + "\n")
    with pytest.raises(ChatFormatError) as e:
        read_chat_file(path)
    assert str(e.value).startswith(f"{path}:4: ") and why in str(e.value) and "\n" not in str(e.value), str(e.value)


def test_both_line_forms_read_and_an_empty_file_is_refused(tmp_path):
    path = tmp_path / "chat.jsonl"
    path.write_text(json.dumps(GOOD) + "\n" + json.dumps({"prompt": "a", "response": "b"}) + "\n")
    convs, lines = read_chat_file(path)
    assert lines == [1, 2] and convs[1] == [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}]
    path.write_text("\n\n")
    with pytest.raises(ChatFormatError, match="holds no conversations"):
        read_chat_file(path)


def test_the_mask_covers_exactly_the_assistant_tokens(tokenizer):
    ex = tokenize_chat(GOOD["messages"], tokenizer)
    text = tokenizer.apply_chat_template(GOOD["messages"], tokenize=False)
    assert tokenizer.decode(ex.ids) == text
    # the assistant's tokens, in order: each answer and its end-of-turn token (and the newline ChatML puts after)
    assert tokenizer.decode(ex.ids[ex.assistant]) == "Paris.<|im_end|>\nMadrid is the capital of Spain.<|im_end|>\n"
    assert tokenizer.decode(ex.ids[~ex.assistant]).count("<|im_start|>") == 4       # every turn's header: not trained


def test_pack_puts_every_target_in_one_row_and_pad_masks_the_padding(tokenizer):
    examples = [tokenize_chat(GOOD["messages"], tokenizer), tokenize_chat(
        [{"role": "user", "content": "Say hi."}, {"role": "assistant", "content": "Hi."}], tokenizer)]
    stream = torch.cat([e.ids for e in examples])
    keep = torch.cat([e.assistant for e in examples])
    packed = ChatRows.pack(examples, seq=8, pad_id=1)
    assert packed.inputs.shape[1] == 8 and packed.assistant_tokens == int(keep[1:].sum())
    real = stream.numel() - 1                                              # targets of the stream: tokens 1..T-1
    assert torch.equal(packed.targets.reshape(-1)[:real], stream[1:])
    assert torch.equal(packed.mask.reshape(-1)[:real], keep[1:].float()) and packed.mask.reshape(-1)[real:].sum() == 0
    padded = ChatRows.pad(examples, seq=64, pad_id=1)
    assert len(padded) == 2 and padded.truncated == 1                    # the first is longer than 65 tokens
    n = examples[1].ids.numel()
    assert torch.equal(padded.mask[1, : n - 1], examples[1].assistant[1:].float()) and padded.mask[1, n - 1:].sum() == 0
    assert torch.equal(padded.targets[0], examples[0].ids[1:65])
    assert padded.batch(0, 4)[0].shape == (4, 64)
    assert sorted(padded.batch(0, 2)[1][:, 0].tolist()) == sorted(padded.targets[:, 0].tolist())  # an epoch: all


def test_a_conversation_whose_answer_is_cut_off_is_refused_when_padded(tokenizer, tmp_path):
    path = tmp_path / "chat.jsonl"
    path.write_text(json.dumps({"prompt": "Hi.", "response": "Hello."}) + "\n"
                    + json.dumps({"prompt": "word " * 60, "response": "x"}) + "\n")
    with pytest.raises(ChatFormatError, match=rf"{path}:2: no assistant token within the first 33 tokens"):
        load_chat(path, tokenizer, seq=32, layout="pad")
    data = load_chat(path, tokenizer, seq=32, layout="pack", heldout_frac=0.5)
    assert data.conversations == 1 and data.heldout_conversations == 1 and data.heldout is not None


def test_the_shipped_instruction_set_reads(tokenizer):
    convs, _ = read_chat_file(KJV_INSTRUCTIONS)
    assert len(convs) == 377 and all(any(m["role"] == "assistant" for m in c) for c in convs)
    data = load_chat(KJV_INSTRUCTIONS, tokenizer, seq=64, heldout_frac=0.1)
    assert data.heldout_conversations == 38 and data.train.assistant_tokens > 0
