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
