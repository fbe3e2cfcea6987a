"""slime.utils.mask_utils for plug-ins (slick/compat/slime/utils/mask_utils.py), on the tiny model's chat template,
with the conversation of slime's own test (tests/utils/test_mask_utils.py)."""
import pytest
from transformers import AutoTokenizer

from slick.compat.finder import install

install()
from slime.utils.mask_utils import MultiTurnLossMaskGenerator, get_response_lengths  # noqa: E402

MESSAGES = [{"role": "system", "content": "SYSTEM MESSAGE FOR TESTING ONLY"},
            {"role": "user", "content": "USER CONTENT FOR TESTING ONLY"},
            {"role": "assistant", "content": "ASSISTANT RESPONSE FOR TESTING ONLY"}]


@pytest.fixture(scope="module")
def tok(tiny_model_dir):
    return AutoTokenizer.from_pretrained(tiny_model_dir)


def test_single_turn(tok):
    gen = MultiTurnLossMaskGenerator(tok, tokenizer_type="qwen3")
    ids, mask = gen.gen_multi_turn_loss_mask_qwen3(MESSAGES)
    assert ids == tok(tok.apply_chat_template(MESSAGES, tokenize=False), add_special_tokens=False)["input_ids"]
    assert len(ids) == len(mask)
    assert gen.get_text_from_loss_mask(ids, mask) == ["ASSISTANT RESPONSE FOR TESTING ONLY<|im_end|>\n"]
    assert gen.get_response_lengths([mask]) == [mask[::-1].index(0)]     # the assistant turn ends the chat


def test_multi_turn_with_a_masked_step(tok):
    gen = MultiTurnLossMaskGenerator(tok)
    messages = MESSAGES + [{"role": "user", "content": "again"},
                           {"role": "assistant", "content": "SECOND", "step_loss_mask": 0},
                           {"role": "user", "content": "once more"}, {"role": "assistant", "content": "THIRD"}]
    ids, mask = gen.get_loss_mask(messages)
    assert gen.get_text_from_loss_mask(ids, mask) == ["ASSISTANT RESPONSE FOR TESTING ONLY<|im_end|>\n",
                                                      "THIRD<|im_end|>\n"]


def test_helpers():
    assert get_response_lengths([[0, 0, 1, 1, 0], [0, 0], [1]]) == [3, 0, 1]
    with pytest.raises(ValueError, match="Unsupported tokenizer type: llama"):
        MultiTurnLossMaskGenerator(None, "llama")
