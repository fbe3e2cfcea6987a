"""Chat templates for the multi-turn tests, written here (Llama-3 and Qwen shapes), set on copies of SmolLM2's
tokenizer. Their header markers are plain text for that tokenizer; the end of a turn is its EOS token."""
import copy

# Llama-3 shape: BOS first, "<|start_header_id|>role<|end_header_id|>\n\n", trimmed content, end-of-turn token
# right after the content (no newline), tool results under the "ipython" role; no tools section (tools=
# ignored, so slick renders the schemas into the system prompt).
LLAMA3_STYLE = (
    "{{- bos_token }}"
    "{%- for m in messages %}"
    "{%- set role = 'ipython' if m['role'] == 'tool' else m['role'] %}"
    "{{- '<|start_header_id|>' + role + '<|end_header_id|>\\n\\n' + (m['content'] | trim) + eos_token }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}{%- endif %}"
)

# Qwen shape: tools rendered into the system message; consecutive tool messages share ONE user turn
# (<tool_response> blocks), which is closed only after the last of them.
QWEN_STYLE = (
    "{%- if tools %}"
    "{{- '<|im_start|>system\\n' }}"
    "{%- if messages[0]['role'] == 'system' %}{{- messages[0]['content'] + '\\n\\n' }}{%- endif %}"
    "{{- '# Tools\\n<tools>' }}{%- for t in tools %}{{- '\\n' + (t | tojson) }}{%- endfor %}"
    "{{- '\\n</tools><|im_end|>\\n' }}"
    "{%- elif messages[0]['role'] == 'system' %}"
    "{{- '<|im_start|>system\\n' + messages[0]['content'] + '<|im_end|>\\n' }}"
    "{%- endif %}"
    "{%- for m in messages %}"
    "{%- if m['role'] == 'system' %}"
    "{%- elif m['role'] == 'tool' %}"
    "{%- if loop.first or messages[loop.index0 - 1]['role'] != 'tool' %}{{- '<|im_start|>user' }}{%- endif %}"
    "{{- '\\n<tool_response>\\n' + m['content'] + '\\n</tool_response>' }}"
    "{%- if loop.last or messages[loop.index0 + 1]['role'] != 'tool' %}{{- '<|im_end|>\\n' }}{%- endif %}"
    "{%- else %}"
    "{{- '<|im_start|>' + m['role'] + '\\n' + m['content'] + '<|im_end|>\\n' }}"
    "{%- endif %}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)

# Rewrites earlier turns: the system header counts the messages.
COUNTING = (
    "{{- '<|im_start|>system\\nmessages: ' + (messages | length | string) + '<|im_end|>\\n' }}"
    "{%- for m in messages %}{{- '<|im_start|>' + m['role'] + '\\n' + m['content'] + '<|im_end|>\\n' }}{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)

# Rewrites earlier turns (Qwen3-like): reasoning of assistant turns before the last user message is dropped.
DROPS_REASONING = (
    "{%- set ns = namespace(last_user=-1) %}"
    "{%- for m in messages %}{%- if m['role'] == 'user' %}{%- set ns.last_user = loop.index0 %}{%- endif %}"
    "{%- endfor %}"
    "{%- for m in messages %}"
    "{%- set c = m['content'] %}"
    "{%- if m['role'] == 'assistant' and loop.index0 < ns.last_user and '</think>' in c %}"
    "{%- set c = c.split('</think>')[-1] | trim %}{%- endif %}"
    "{{- '<|im_start|>' + m['role'] + '\\n' + c + '<|im_end|>\\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)


def tokenizer_with(template):
    """A copy of SmolLM2's tokenizer with ``template`` (None: SmolLM2's own)."""
    from slick.models.tiny import load_demo_tokenizer

    tok = copy.deepcopy(load_demo_tokenizer())
    if template is not None:
        tok.chat_template = template
    return tok
