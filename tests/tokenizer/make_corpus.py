#!/usr/bin/env python3
"""Writes corpus.jsonl (tokenizer parity inputs). Rerun after editing; commit both files.

Lines are {"text": str} or {"hex": bytes-as-hex} for input that is not valid UTF-8."""
import json
import random

texts = [
    "", " ", "  ", "\n", "\n\n\n", "\t", " \t \n ", "a", "Hello world", "Hello, world!",
    "hello   world    with     runs      of       spaces",
    "    leading and trailing spaces    ",
    "line one\nline two\r\nline three\rline four\n\n\n\nafter blank lines",
    "tabs\tand\t\ttabs\t\t\tand spaces \t mixed",
    "The quick brown fox jumps over the lazy dog. THE QUICK BROWN FOX! the-quick_brown.fox",
    "It's, they're, we've, I'm, you'll, he'd. DON'T SHOUT. 'quoted' \"double\"",
    "Numbers: 0 1 12 123 1234 12345 123456 1234567 3.14159 -42 +7 1e10 0x1F 1,000,000",
    "Dates 2024-01-31T12:34:56Z and phone +1 (555) 010-9999, version v1.2.3-rc4",
    "Full-width digits １２３４５ and Arabic-Indic ٠١٢٣٤٥٦ and Devanagari ०१२३",
    "Superscripts x² y³ fractions ½ ¾ roman Ⅻ circled ① ② ③",
    "中文分词测试：我爱北京天安门，天安门上太阳升。",
    "混合English和中文mixed在一起123个字符",
    "日本語のテキスト、ひらがなとカタカナ（カタカナ）と漢字を含む。",
    "한국어 텍스트도 포함합니다. 안녕하세요!",
    "Русский текст: Съешь же ещё этих мягких французских булок, да выпей чаю.",
    "Ελληνικά: Ξεσκεπάζω την ψυχοφθόρα βδελυγμία.",
    "العربية: نص تجريبي باللغة العربية مع أرقام ١٢٣",
    "עברית: טקסט לדוגמה בעברית",
    "हिन्दी: यह एक परीक्षण वाक्य है।",
    "ไทย: ภาษาไทยไม่มีช่องว่างระหว่างคำ",
    "Tiếng Việt: Tôi yêu tiếng Việt có dấu",
    "Türkçe: Şişli'de çöp kutusu; Ğğ İı",
    "Emoji: 😀 😃 😄 👍🏽 ❤️ 🇺🇸 🇯🇵 🏳️‍🌈",
    "ZWJ family 👨‍👩‍👧‍👦 and 👩🏾‍💻 and 🧑‍🤝‍🧑 sequences",
    "Combining: e\u0301 a\u0308 n\u0303 Z\u0351\u0352\u0353a\u0354\u0355l\u0356g\u0357o",
    "Zero width: a\u200bb\u200cc\u200dd\ufeffe",
    "Unicode spaces:\u00a0nbsp\u2002en\u2003em\u3000ideographic\u2028ls\u2029ps\u0085nel",
    "Math: ∀x∈ℝ, ∃y: x²+y² ≤ 1 ⇒ |x| ≤ 1; ∑ᵢ aᵢ = ∫₀¹ f(t) dt",
    "Symbols: © ® ™ § ¶ † ‡ • … ‰ € £ ¥ ₹ ₿ ← → ↑ ↓",
    "Punctuation!!! ??? ... --- ___ *** ### @@@ $$$ %%% ^^^ &&& (((( )))) [[[ ]]] {{{ }}}",
    "def fibonacci(n: int) -> int:\n    if n < 2:\n        return n\n    return fibonacci(n - 1) + fibonacci(n - 2)\n",
    "#include <stdio.h>\n\nint main(int argc, char** argv) {\n\tprintf(\"%d\\n\", argc);\n\treturn 0;\n}\n",
    "const f = async (x) => { await fetch(`/api/${x}?q=1&r=2`); return x?.y ?? 'z'; };",
    "SELECT id, name FROM users WHERE age >= 18 AND name LIKE '%smith%' ORDER BY id DESC;",
    "<html><body><div class=\"a\">Hello &amp; welcome</div></body></html>",
    "{\"key\": \"value\", \"list\": [1, 2, 3], \"nested\": {\"a\": null, \"b\": true}}",
    "URL https://example.com/path/to/page?query=string&x=1#fragment and mail a.b@c.de",
    "Path C:\\Users\\name\\file.txt and /usr/local/bin/python3",
    "Markdown **bold** _italic_ `code` [link](http://x.y) > quote\n- item\n1. item",
    "$$\\frac{a}{b} + \\sqrt{x^2 + y^2} = \\alpha_i^{\\beta}$$",
    "<｜begin▁of▁sentence｜>special tokens inside text<｜end▁of▁sentence｜>",
    "<｜User｜>Hello<｜Assistant｜>Hi there<｜end▁of▁sentence｜>",
    "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>f<｜tool▁call▁end｜>",
    "not quite special <｜User|> <|User｜> <｜User ｜> <｜▁pad▁｜>",
    "glued<｜fim▁hole｜>tokens<｜fim▁begin｜>x<｜fim▁end｜>  spaced  <｜fim▁hole｜>  ",
    "<think>\nreasoning here\n</think>\n\nanswer",
    "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa",
    "abababababababababababababababababababababababababababababababab",
    "!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!",
    "Mixed\u00a0scripts: Hello世界Привет세계مرحبا🌍",
    "Ligatures ﬁ ﬂ and full-width ＡＢＣ ａｂｃ and half-width ｶﾀｶﾅ",
    "Private use \ue000\uf8ff and supplementary 𝐀𝐁𝐂 𝔸𝔹ℂ 𠀀𠀁 𓀀",
    "Control chars \u0001\u0002\u001f\u007f and bell \u0007",
    "U+FFFD itself: \ufffd and BOM \ufeff",
]
texts.append(" " * 100 + "x" + "\n" * 50 + "y" + "\t" * 30)
texts.append("中" * 300)
texts.append("word " * 200)
texts.append("\n".join(f"{i}: item number {i * 7919 % 10007}" for i in range(60)))

rng = random.Random(4)
alphabet = ("abcdefghijklmnopqrstuvwxyz ABCXYZ0123456789 ,.;:!?'\"-_()[]{}<>/\\|@#$%^&*+=~`\n\t"
            "éüßçñ中文字日本語カタカナひらがな한국어Ωλβ🙂👍🏽‍️Δ∑€ \u00a0\u3000")
for _ in range(60):
    n = rng.randint(1, 200)
    texts.append("".join(rng.choice(alphabet) for _ in range(n)))

# Random strings over characters where regex engines disagree most: Unicode whitespace and
# format characters (U+180E, U+200B, U+FEFF), characters newer than PCRE2's Unicode tables
# (U+1FA70.., CJK extension G), combining marks, digits of several scripts, CJK and kana.
pool = ([chr(c) for c in range(0x20, 0x7F)] * 3 +
        list(" \t\n\r\u000b\u000c\u001c\u0085\u00a0\u1680\u180e\u2000\u200a\u200b\u2028"
             "\u2029\u202f\u205f\u3000\ufeff") +
        [chr(c) for c in range(0x1FA70, 0x1FB00)] + [chr(c) for c in range(0x1F8B0, 0x1F8C0)] +
        [chr(c) for c in range(0x30000, 0x30040)] + [chr(c) for c in range(0x0300, 0x0370)] +
        list("0123456789０１２٣४") + [chr(c) for c in range(0x4E00, 0x4E40)] +
        [chr(c) for c in range(0x3040, 0x3100)] + [chr(c) for c in range(0xAC00, 0xAC40)])
for _ in range(300):
    texts.append("".join(rng.choice(pool) for _ in range(rng.randint(1, 80))))

invalid = [
    b"\xff", b"abc\x80def", b"\xc3", b"\xc3(", b"\xe4\xbd", b"\xe4\xbd\xa0\xe5",
    b"\xed\xa0\x80 surrogate", b"\xf4\x90\x80\x80 too big", b"\xc0\xaf overlong",
    b"ok \xf0\x9f\x98 cut emoji \xf0\x9f\x98\x80 whole", b"\xfe\xfe\xff\xff",
]

with open("corpus.jsonl", "w", encoding="utf-8") as out:
    for text in texts:
        out.write(json.dumps({"text": text}, ensure_ascii=False) + "\n")
    for raw in invalid:
        out.write(json.dumps({"hex": raw.hex()}) + "\n")

# ---- conversations.jsonl: chat-template parity inputs ({"messages", "add_generation_prompt"?,
# "tools"?}); rendered by @huggingface/jinja and by ChatTemplate.
def call(name, arguments, i=0):
    return {"id": f"call_{i}", "type": "function",
            "function": {"name": name, "arguments": json.dumps(arguments, ensure_ascii=False)}}

conversations = [
    {"messages": [{"role": "user", "content": "Hello!"}]},
    {"messages": [{"role": "user", "content": "Hello!"}], "add_generation_prompt": False},
    {"messages": [{"role": "system", "content": "You are a helpful assistant."},
                  {"role": "user", "content": "What is 2+2?"}]},
    {"messages": [{"role": "system", "content": "First system."},
                  {"role": "system", "content": "Second system."},
                  {"role": "user", "content": "hi"},
                  {"role": "system", "content": "Late system prompt."}]},
    {"messages": [{"role": "user", "content": "Tell me a joke."},
                  {"role": "assistant", "content": "Why did the chicken cross the road?"},
                  {"role": "user", "content": "Why?"},
                  {"role": "assistant", "content": "To get to the other side."},
                  {"role": "user", "content": "Another one, in 中文 please 😀"}]},
    {"messages": [{"role": "user", "content": "Weather in Paris and Tokyo?"},
                  {"role": "assistant", "content": None,
                   "tool_calls": [call("get_weather", {"city": "Paris"}, 0),
                                  call("get_weather", {"city": "東京"}, 1)]},
                  {"role": "tool", "content": "{\"temp\": 18}"},
                  {"role": "tool", "content": "{\"temp\": 25}"},
                  {"role": "assistant", "content": "Paris is 18°C, Tokyo 25°C."},
                  {"role": "user", "content": "Thanks"}],
     "tools": [{"type": "function", "function": {"name": "get_weather", "parameters": {
         "type": "object", "properties": {"city": {"type": "string"}}}}}]},
    {"messages": [{"role": "user", "content": "Search once."},
                  {"role": "assistant", "content": None,
                   "tool_calls": [call("search", {"q": "deepinfer"})]},
                  {"role": "tool", "content": "no results"}]},
    {"messages": [{"role": "user", "content": "Two tool turns."},
                  {"role": "assistant", "content": None, "tool_calls": [call("a", {})]},
                  {"role": "tool", "content": "A"},
                  {"role": "assistant", "content": None, "tool_calls": [call("b", {"x": [1, 2]})]},
                  {"role": "tool", "content": "B"},
                  {"role": "assistant", "content": "done"}], "add_generation_prompt": False},
    {"messages": [{"role": "user", "content": "  spaces  \n\n and newlines \t"},
                  {"role": "assistant", "content": ""},
                  {"role": "user", "content": "<｜User｜>fake special<｜end▁of▁sentence｜>"}]},
    {"messages": [{"role": "system", "content": ""}, {"role": "user", "content": ""}]},
    {"messages": []},
    {"messages": [{"role": "assistant", "content": "Assistant speaks first."},
                  {"role": "user", "content": "ok"}]},
    {"messages": [{"role": "user", "content": "x" * 2000 + "\n" + "長い" * 500}]},
    {"messages": [{"role": "user", "content": "Code:\n```python\nprint('hi')\n```"},
                  {"role": "assistant", "content": "```js\nconsole.log(\"hi\")\n```"}]},
    {"messages": [{"role": "developer", "content": "unknown role is ignored"},
                  {"role": "user", "content": "hi"}]},
    # Missing tool_calls on a content-less assistant message: both renderers must fail.
    {"messages": [{"role": "user", "content": "x"}, {"role": "assistant", "content": None}]},
]
with open("conversations.jsonl", "w", encoding="utf-8") as out:
    for conversation in conversations:
        out.write(json.dumps(conversation, ensure_ascii=False) + "\n")

# ---- jinja_cases.jsonl: templates exercising Jinja features, rendered by both renderers.
cases = [
    ("Hello {{ name }}!", {"name": "world"}),
    ("{{ 1 + 2 * 3 }}|{{ (1 + 2) * 3 }}|{{ 7 // 2 }}|{{ 7 / 2 }}|{{ 7 % 3 }}|{{ -7 // 2 }}|{{ 4 / 2 }}", {}),
    ("{{ 'a' ~ 1 ~ none }}|{{ 'a' + 'b' }}|{{ -3 }}|{{ 2.0 }}|{{ 2.5 }}|{{ 0.1 + 0.2 }}", {}),
    ("{{ true }}|{{ none }}|{{ missing }}|{{ [1, 'a', none, false] }}|{{ {'k': [1]} }}", {}),
    ("{{ 'yes' if x else 'no' }}{{ 'only' if x }}", {"x": False}),
    ("a  {{- 'b' -}}  c|a  {%- if true -%}  b  {%- endif -%}  c", {}),
    ("  {% if true %}\n  yes\n  {% endif %}\n  end\n", {}),
    ("line\n    {% for x in xs %}\n    - {{ x }}\n    {% endfor %}\ndone\n", {"xs": [1, 2]}),
    ("a{# comment #}b{#- trimmed -#}  c", {}),
    ("{% set x = 1 %}{% for i in [1] %}{% set x = 2 %}{% endfor %}{{ x }}", {}),
    ("{% set ns = namespace(x=1, s='') %}{% for i in [1, 2] %}{% set ns.x = ns.x + i %}"
     "{% set ns.s = ns.s + i|string %}{% endfor %}{{ ns.x }}{{ ns.s }}", {}),
    ("{% set block %}x{{ 1 }}y{% endset %}[{{ block }}]", {}),
    ("{% if x == 1 %}one{% elif x == 2 %}two{% else %}many{% endif %}", {"x": 2}),
    ("{% for x in xs %}{{ loop.index }}{{ loop.index0 }}{{ loop.first }}{{ loop.last }}"
     "{{ loop.length }}{{ loop.revindex }}{{ loop.revindex0 }};{% endfor %}", {"xs": ["a", "b", "c"]}),
    ("{% for x in [] %}x{% else %}empty{% endfor %}", {}),
    ("{% for x in [1, 2, 3] %}{% if x == 2 %}{% break %}{% endif %}{{ x }}{% endfor %}", {}),
    ("{% for x in [1, 2, 3] %}{% if x == 2 %}{% continue %}{% endif %}{{ x }}{% endfor %}", {}),
    ("{% for k, v in d.items() %}{{ k }}={{ v }};{% endfor %}", {"d": {"b": 1, "a": 2}}),
    ("{% macro f(a, b='d') %}[{{ a }}-{{ b }}]{% endmacro %}{{ f(1) }}{{ f(1, b=2) }}{{ f(1, 2) }}", {}),
    ("{{ '  x '|trim }}|{{ [1, 2]|length }}|{{ 'abc'|length }}|{{ [1, 2]|join('-') }}|{{ {'a': 1}|length }}", {}),
    ("{{ {'a': 1, 'b': [true, none], 'c': 'x\"y\\n', 'd': 1.5, 'é': 'ü'}|tojson }}", {}),
    ("{{ [1, {'a': [2]}]|tojson(indent=2) }}", {}),
    ("{{ tools|tojson }}", {"tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}]}),
    ("{{ x|default('d') }}{{ none|default('n', true) }}{{ 'v'|default('d') }}", {}),
    ("{{ 'Hello'.upper() }}{{ 'x y'.title() }}{{ ' a '.strip() }}{{ 'a,b'.split(',')|last }}"
     "{{ 'abc'.startswith('ab') }}{{ 'abc'.endswith('bc') }}{{ 'xxa'.lstrip('x') }}{{ 'a b  c'.split()|length }}", {}),
    ("{{ 'abc'[::-1] }}{{ [1, 2, 3][1:]|first }}{{ 'abc'[-1] }}{{ [1, 2, 3][-2:] }}{{ 'hello'[1:3] }}", {}),
    ("{{ ms|selectattr('role', 'equalto', 'user')|map(attribute='c')|join(',') }}"
     "{{ ms|rejectattr('role', 'equalto', 'user')|list|length }}",
     {"ms": [{"role": "user", "c": "u1"}, {"role": "x", "c": "x"}, {"role": "user", "c": "u2"}]}),
    ("{{ d.get('a') }}{{ d.get('z', 'fallback') }}{{ d.missing is defined }}{{ d['a'] }}", {"d": {"a": 1}}),
    ("{{ x is defined }}{{ none is none }}{{ 1 is not none }}{{ 'a' is string }}{{ {} is mapping }}"
     "{{ 3 is odd }}{{ 1 is number }}{{ [1] is iterable }}{{ true is boolean }}", {}),
    ("{{ 'a' in 'abc' }}{{ 1 in [1] }}{{ 'k' not in {'k': 1} }}{{ not 0 }}{{ [] and 1 }}{{ 0 or 'x' }}", {}),
    ("{{ [3, 1, 2]|sort }}{{ [1, 2]|reverse|list }}{{ 'ab'|upper }}{{ 'AB'|lower }}{{ 'hello world'|title }}"
     "{{ 'hello'|capitalize }}{{ 1.5|int }}{{ '3'|int + 1 }}{{ 2|float }}{{ -3|abs }}", {}),
    ("{{ [1, 2] + [3] }}{{ range(3)|list }}{{ range(1, 7, 2)|join }}", {}),
    ("{{ 'a\\nb' }}|{{ \"it's\" }}|{{ 'tab\\there' }}|{{ 'x' 'y' }}", {}),
    ("{% if messages[0]['role'] == 'system' %}{% set loop_messages = messages[1:] %}"
     "{% else %}{% set loop_messages = messages %}{% endif %}{% for message in loop_messages %}"
     "{% if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}"
     "{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}"
     "{% endif %}{{ message['role'] }}:{{ message['content']|trim }};{% endfor %}",
     {"messages": [{"role": "system", "content": "s"}, {"role": "user", "content": " u "},
                   {"role": "assistant", "content": "a"}]}),
    ("{{ raise_exception('boom') }}", {}),
    ("{% for m in messages %}{{ m.role }}{% if not loop.last %},{% endif %}{% endfor %}",
     {"messages": [{"role": "a"}, {"role": "b"}]}),
    ("{{ ' x '|trim|length }}{{ ('a' ~ 'b')|upper }}{{ 10 - 2 - 3 }}{{ 2 * 3 + 1 }}{{ 1 < 2 < 3 }}", {}),
    ("{{ 'héllo'|length }}|{{ '你好😀'|length }}|{{ '你好'[0] }}|{{ '😀x'[2:] }}|{{ 'ébc'|title }}"
     "|{{ 'abc'.length }}|{{ '日本語'[-1] }}|{{ '日本語'[::-1] }}", {}),
    ("{{ 'x'.startswith(('a', 'x')) }}{{ 'aaa'.replace('a', 'b', 2) }}{{ {'b': 1, 'a': 2}|dictsort }}"
     "{{ 2 ** 3 }}{{ 2 * 3 ** 2 }}{{ 2 ** 0.5 > 1 }}", {}),
    ("[{{ missing.attr.deeper }}{{ none.x }}{{ [1]['x'] }}]{{ 'abc'[2:-1:-1] }}{{ 'abcd'[-3:-1] }}"
     "{{ [1, 2, 3][::-2] }}{{ [1, 2, 3][5:] }}", {}),
    ("a\u00a0\u3000 {{- 'b' -}} \u2003\nc{{ 'x' }}\u00a0{%- if true %}y{% endif %}", {}),
    ("{{ 'straße ﬁ éà ÿ ǆ ωσ ǰ'|upper }}|{{ 'ÉCOLE ΟΔΥΣΣΕΥΣ İ Σ ΑΣ.'|lower }}|{{ 'été'|capitalize }}"
     "|{{ 'Привет'.upper() }}{{ 'ΣΑΣ'.lower() }}|{{ 'ǅ'|lower }}{{ 'ǅ'|upper }}", {}),
    ("{{ '\u00a0x\u3000'|trim }}|{{ ' x\n'.strip() }}|{{ 'xx'.rstrip('x') }}", {}),
    ("{%- set x = 'a' -%}\n  {{ x }}  \n{%- if true %}\n  in\n{%- endif %}\nend", {}),
]

# Larger templates in the style of real chat templates (written for this corpus): reversed
# scans with namespace, reasoning split on </think>, tool calls as JSON, tool-result grouping.
TOOL_STYLE = (
    "{%- set ns = namespace(last_user=-1, sys='') %}"
    "{%- for m in messages[::-1] %}{%- set i = (messages|length - 1) - loop.index0 %}"
    "{%- if ns.last_user < 0 and m.role == 'user' and m.content is string %}"
    "{%- set ns.last_user = i %}{%- endif %}{%- endfor %}"
    "{%- if tools %}<|system|>\n# Tools\n{%- for t in tools %}\n{{ t | tojson }}{%- endfor %}\n"
    "{%- if messages[0].role == 'system' %}{{ messages[0].content | trim }}\n{%- endif %}<|end|>\n"
    "{%- elif messages and messages[0]['role'] == 'system' %}<|system|>\n{{ messages[0]['content'] }}<|end|>\n"
    "{%- endif %}"
    "{%- for m in messages %}"
    "{%- set content = m.content if m.content is string else '' %}"
    "{%- if m.role == 'user' or (m.role == 'system' and not loop.first) %}"
    "<|{{ m.role }}|>\n{{ content }}<|end|>\n"
    "{%- elif m.role == 'assistant' %}"
    "{%- if '</think>' in content %}"
    "{%- set reasoning = content.split('</think>')[0].rstrip('\\n').split('<think>')[-1].lstrip('\\n') %}"
    "{%- set content = content.split('</think>')[-1].lstrip('\\n') %}"
    "{%- else %}{%- set reasoning = '' %}{%- endif %}"
    "<|assistant|>\n{%- if loop.index0 > ns.last_user and reasoning %}<think>{{ reasoning.strip() }}</think>{%- endif %}"
    "{{ content }}"
    "{%- if m.tool_calls %}{%- for call in m.tool_calls %}"
    "{%- if (loop.first and content) or not loop.first %}\n{%- endif %}"
    "{%- set f = call.function if call.function else call %}"
    "<call>{\"name\": \"{{ f.name }}\", \"arguments\": "
    "{{ f.arguments if f.arguments is string else f.arguments | tojson }}}</call>"
    "{%- endfor %}{%- endif %}<|end|>\n"
    "{%- elif m.role == 'system' %}"
    "{%- elif m.role == 'tool' %}"
    "{%- if loop.first or messages[loop.index0 - 1].role != 'tool' %}<|user|>{%- endif %}"
    "\n<result>{{ content }}</result>"
    "{%- if loop.last or messages[loop.index0 + 1].role != 'tool' %}<|end|>\n{%- endif %}"
    "{%- else %}{{ raise_exception('unknown role: ' + m.role) }}"
    "{%- endif %}{%- endfor %}"
    "{%- if add_generation_prompt %}<|assistant|>\n{%- endif %}")
TOOLS = [{"type": "function", "function": {"name": "get_weather", "description": "Weather.",
          "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                         "required": ["city"]}}}]
tool_conversations = [
    {"messages": [{"role": "user", "content": "hi"}], "add_generation_prompt": True},
    {"messages": [{"role": "system", "content": "  be brief  "}, {"role": "user", "content": "Weather?"},
                  {"role": "assistant", "content": "<think>\nneed tool\n</think>\n\nChecking.",
                   "tool_calls": [{"type": "function", "function": {"name": "get_weather",
                                                                    "arguments": {"city": "Paris"}}},
                                  {"name": "get_weather", "arguments": "{\"city\": \"Nice\"}"}]},
                  {"role": "tool", "content": "18C"}, {"role": "tool", "content": "21C"},
                  {"role": "assistant", "content": "<think>both known</think>Paris 18C, Nice 21C."}],
     "tools": TOOLS, "add_generation_prompt": False},
    {"messages": [{"role": "user", "content": "a"}, {"role": "assistant", "content": "<think>old</think>b"},
                  {"role": "user", "content": "c"}, {"role": "assistant", "content": None,
                   "tool_calls": [{"function": {"name": "f", "arguments": {}}}]}],
     "add_generation_prompt": True},
    {"messages": [{"role": "wizard", "content": "x"}]},
]
for conversation in tool_conversations:
    cases.append((TOOL_STYLE, dict(conversation, tools=conversation.get("tools", []))))

LLAMA_STYLE = (
    "{{- bos_token }}{%- if messages[0]['role'] == 'system' %}"
    "{%- set system_message = messages[0]['content']|trim %}{%- set messages = messages[1:] %}"
    "{%- else %}{%- set system_message = '' %}{%- endif %}"
    "<|start_header_id|>system<|end_header_id|>\n\n"
    "{%- if tools is not none %}Environment: ipython\n{%- endif %}\n"
    "Today Date: {{ date_string | default('26 Jul 2024') }}\n\n"
    "{%- if tools is not none %}Use these functions:\n\n{%- for t in tools %}{{- t | tojson(indent=4) }}\n\n{%- endfor %}{%- endif %}"
    "{{- system_message }}<|eot_id|>"
    "{%- for message in messages %}"
    "{%- if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}"
    "{{- raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}{%- endif %}"
    "{{- '<|start_header_id|>' + message['role'] + '<|end_header_id|>\n\n' + message['content'] | trim + '<|eot_id|>' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|start_header_id|>assistant<|end_header_id|>\n\n' }}{%- endif %}")
for conversation in [
        {"messages": [{"role": "system", "content": " sys "}, {"role": "user", "content": " hi "},
                      {"role": "assistant", "content": "hello"}, {"role": "user", "content": "bye"}],
         "add_generation_prompt": True, "bos_token": "<|begin_of_text|>", "tools": None},
        {"messages": [{"role": "user", "content": "x"}], "add_generation_prompt": False,
         "bos_token": "<s>", "tools": TOOLS},
        {"messages": [{"role": "user", "content": "x"}, {"role": "user", "content": "y"}],
         "bos_token": "<s>", "tools": None}]:
    cases.append((LLAMA_STYLE, conversation))

with open("jinja_cases.jsonl", "w", encoding="utf-8") as out:
    for template, context in cases:
        out.write(json.dumps({"template": template, "context": context}, ensure_ascii=False) + "\n")
