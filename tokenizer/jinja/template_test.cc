#include "tokenizer/jinja/template.h"

#include <string>

#include "gtest/gtest.h"

namespace deepinfer::tokenizer::jinja {
namespace {

std::string Render(const std::string& source, const std::string& context_json = "{}") {
  auto parsed = Template::Parse(source);
  if (!parsed.ok()) return "PARSE ERROR: " + std::string(parsed.status().message());
  auto context = nlohmann::ordered_json::parse(context_json, nullptr, false);
  EXPECT_FALSE(context.is_discarded()) << context_json;
  auto rendered = (*parsed)->Render(Value::FromJson(context));
  if (!rendered.ok()) return "ERROR: " + std::string(rendered.status().message());
  return *rendered;
}

absl::Status RenderStatus(const std::string& source) {
  auto parsed = Template::Parse(source);
  if (!parsed.ok()) return parsed.status();
  return (*parsed)->Render(Value::NewObject()).status();
}

TEST(TemplateTest, TextAndExpressions) {
  EXPECT_EQ(Render("Hello {{ name }}!", R"({"name": "world"})"), "Hello world!");
  EXPECT_EQ(Render("{{ 1 + 2 * 3 }}|{{ (1 + 2) * 3 }}|{{ 7 // 2 }}|{{ 7 / 2 }}|{{ 7 % 3 }}"),
            "7|9|3|3.5|1");
  EXPECT_EQ(Render("{{ 'a' ~ 1 ~ 2.0 }}|{{ 'a' + 'b' }}|{{ 'a' + 1 }}|{{ -3 }}|{{ 2.0 }}"),
            "a12|ab|a1|-3|2.0");
  // JavaScript equality, as @huggingface/jinja: none == undefined, 1 == '1'.
  EXPECT_EQ(Render("{{ missing == none }}{{ 1 == '1' }}{{ 1 == 1.0 }}{{ [1] == [1] }}"),
            "truetruetruefalse");
  EXPECT_EQ(Render("{{ true }}|{{ none }}|{{ missing }}|{{ [1, 'a'] }}"), "true|||[1, \"a\"]");
  EXPECT_EQ(Render("{{ 'yes' if x else 'no' }}{{ 'only' if x }}", R"({"x": false})"), "no");
}

TEST(TemplateTest, WhitespaceControlAndBlockTrimming) {
  EXPECT_EQ(Render("a  {{- 'b' -}}  c"), "abc");
  EXPECT_EQ(Render("a  {%- if true -%}  b  {%- endif -%}  c"), "abc");
  // trim_blocks + lstrip_blocks, and the trailing newline dropped, as transformers configures.
  EXPECT_EQ(Render("  {% if true %}\n  yes\n  {% endif %}\n  end\n"), "  yes\n  end");
  EXPECT_EQ(Render("a{# comment #}b{#- trimmed -#}  c"), "abc");
}

TEST(TemplateTest, SetScopingAndNamespace) {
  EXPECT_EQ(Render("{% set x = 1 %}{% for i in [1] %}{% set x = 2 %}{% endfor %}{{ x }}"), "1");
  EXPECT_EQ(Render("{% set ns = namespace(x=1) %}{% for i in [1, 2] %}{% set ns.x = ns.x + i %}"
                   "{% endfor %}{{ ns.x }}"),
            "4");
  EXPECT_EQ(Render("{% set a, b = [1, 2] %}{{ b }}{{ a }}"), "21");
  EXPECT_EQ(Render("{% set block %}x{{ 1 }}y{% endset %}[{{ block }}]"), "[x1y]");
}

TEST(TemplateTest, ControlFlowAndLoopVariables) {
  EXPECT_EQ(
      Render("{% if x == 1 %}one{% elif x == 2 %}two{% else %}many{% endif %}", R"({"x": 2})"),
      "two");
  EXPECT_EQ(Render("{% for x in xs %}{{ loop.index }}{{ loop.index0 }}{{ loop.first }}"
                   "{{ loop.last }}{{ loop.length }}{{ loop.revindex }};{% endfor %}",
                   R"({"xs": ["a", "b"]})"),
            "10truefalse22;21falsetrue21;");
  EXPECT_EQ(Render("{% for x in [] %}x{% else %}empty{% endfor %}"), "empty");
  EXPECT_EQ(Render("{% for x in [1, 2, 3, 4] if x is even %}{{ x }}{% endfor %}"), "24");
  EXPECT_EQ(Render("{% for x in [1, 2, 3] %}{% if x == 2 %}{% break %}{% endif %}{{ x }}"
                   "{% endfor %}"),
            "1");
  EXPECT_EQ(Render("{% for x in [1, 2, 3] %}{% if x == 2 %}{% continue %}{% endif %}{{ x }}"
                   "{% endfor %}"),
            "13");
  EXPECT_EQ(Render("{% for k, v in d.items() %}{{ k }}={{ v }};{% endfor %}",
                   R"({"d": {"b": 1, "a": 2}})"),
            "b=1;a=2;");
}

TEST(TemplateTest, Macros) {
  EXPECT_EQ(Render("{% macro f(a, b='d') %}[{{ a }}-{{ b }}]{% endmacro %}"
                   "{{ f(1) }}{{ f(1, b=2) }}{{ f(1, 2) }}"),
            "[1-d][1-2][1-2]");
}

TEST(TemplateTest, FiltersAndMethods) {
  EXPECT_EQ(
      Render("{{ '  x '|trim }}|{{ [1, 2]|length }}|{{ 'abc'|length }}|{{ [1, 2]|join('-') }}"),
      "x|2|3|1-2");
  EXPECT_EQ(Render("{{ {'a': 1, 'b': [true, none], 'c': 'x\"y'}|tojson }}"),
            R"({"a": 1, "b": [true, null], "c": "x\"y"})");
  EXPECT_EQ(Render("{{ [1, 2]|tojson(indent=2) }}"), "[\n  1,\n  2\n]");
  EXPECT_EQ(Render("{{ x|default('d') }}{{ none|default('n', true) }}{{ 'v'|default('d') }}"),
            "dnv");
  EXPECT_EQ(Render("{{ 'Hello'.upper() }}{{ 'x y'.title() }}{{ ' a '.strip() }}"
                   "{{ 'a,b'.split(',')|last }}{{ 'abc'.startswith('ab') }}"),
            "HELLOX Yabtrue");
  EXPECT_EQ(Render("{{ 'abc'[::-1] }}{{ [1, 2, 3][1:]|first }}{{ 'abc'[-1] }}"), "cba2c");
  EXPECT_EQ(Render("{{ ms|selectattr('role', 'equalto', 'user')|map(attribute='c')|join }}",
                   R"({"ms": [{"role": "user", "c": "u1"}, {"role": "x", "c": "x"},
                              {"role": "user", "c": "u2"}]})"),
            "u1u2");
  EXPECT_EQ(Render("{{ d.get('a') }}{{ d.get('z', 'fallback') }}{{ d.missing is defined }}",
                   R"({"d": {"a": 1}})"),
            "1fallbackfalse");
}

TEST(TemplateTest, LenientAccessAndJavaScriptStrings) {
  // Like @huggingface/jinja: attributes of undefined / none are undefined, not errors.
  EXPECT_EQ(Render("[{{ missing.attr.deeper }}{{ none.x }}{{ [1]['x'] }}]"), "[]");
  EXPECT_EQ(Render("{{ '你好😀'|length }}|{{ '😀x'[1:] }}|{{ 'abc'[2:-1:-1] }}"), "4|x|cba");
}

TEST(TemplateTest, Tests) {
  EXPECT_EQ(Render("{{ x is defined }}{{ none is none }}{{ 1 is not none }}{{ 'a' is string }}"
                   "{{ {} is mapping }}{{ 3 is odd }}"),
            "falsetruetruetruetruetrue");
  EXPECT_EQ(Render("{{ 'a' in 'abc' }}{{ 1 in [1] }}{{ 'k' not in {'k': 1} }}"), "truetruefalse");
}

TEST(TemplateTest, Errors) {
  absl::Status raised = RenderStatus("before{{ raise_exception('Roles must alternate') }}");
  EXPECT_EQ(raised.code(), absl::StatusCode::kAborted);
  EXPECT_EQ(raised.message(), "Roles must alternate");
  EXPECT_EQ(RenderStatus("{% if x %}unterminated").code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(RenderStatus("{{ 1 + }}").code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(RenderStatus("{% frobnicate %}").code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(RenderStatus("{{ 'x'|nosuchfilter }}").code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(RenderStatus("{{ 1 is nosuchtest }}").code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(RenderStatus("{{ 'a' - 1 }}").code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(RenderStatus("{{ 'a' ~ none }}").code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(RenderStatus("{{ missing + 1 }}").code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(RenderStatus("{% for x in missing %}{% endfor %}").code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(RenderStatus("{{ {'a': 1}[1] }}").code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(RenderStatus("{{ 'x'.nosuchmethod() }}").code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(RenderStatus("{{ 'unterminated }}").code(), absl::StatusCode::kInvalidArgument);
  // Hostile templates fail cleanly instead of exhausting the stack or memory.
  EXPECT_EQ(RenderStatus("{% macro f() %}{{ f() }}{% endmacro %}{{ f() }}").code(),
            absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(RenderStatus("{{ " + std::string(100000, '(') + "1" + std::string(100000, ')') + " }}")
                .code(),
            absl::StatusCode::kInvalidArgument);
  std::string nested;
  for (int i = 0; i < 100000; ++i) nested += "{% if true %}";
  EXPECT_EQ(RenderStatus(nested).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(RenderStatus("{{ range(1000000000)|length }}").code(),
            absl::StatusCode::kResourceExhausted);
}

}  // namespace
}  // namespace deepinfer::tokenizer::jinja
