// Structured-output microbenchmark over a real tokenizer: JSON Schema compile time and the time
// to compute one token mask, on a set of real-world schemas with a valid document for each.
//
//   bazel run -c opt //common/grammar:grammar_bench -- MODEL_DIR [VOCAB_SIZE] [PASSES]
//
// MODEL_DIR holds tokenizer.json (and tokenizer_config.json for the stop token); VOCAB_SIZE
// defaults to DeepSeek-V3's 129280 rows. Each document is tokenized with the tokenizer and fed
// token by token: before each token (and before the stop token) the mask is computed and timed.
// The first pass over a schema starts with an empty mask cache; later passes reuse it, as
// requests sharing a schema (one batch job) do. Prints avg/p50/p99 for both and compile p50, in
// wall time and in the thread's CPU time (which a shared machine's other load does not inflate).
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <string>
#include <vector>

#include "common/grammar/compiled_grammar.h"
#include "common/grammar/grammar_matcher.h"
#include "common/grammar/structured_output.h"
#include "common/grammar/token_vocabulary.h"
#include "tokenizer/tokenizer.h"

namespace {

using deepinfer::grammar::StructuredOutput;

struct Case {
  const char* name;
  StructuredOutput::Kind kind;
  const char* spec;
  const char* document;
};

const Case
    kCases[] =
        {
            {"person", StructuredOutput::Kind::kJsonSchema,
             R"j({"type":"object","properties":{"name":{"type":"string"},"age":{"type":"integer","minimum":0,"maximum":150},"email":{"type":"string","format":"email"},"is_member":{"type":"boolean"}},"required":["name","age","email","is_member"],"additionalProperties":false})j",
             R"j({"name": "Ada Lovelace", "age": 36, "email": "ada@example.org", "is_member": true})j"},
            {"function_call", StructuredOutput::Kind::kJsonSchema,
             R"j({"type":"object","properties":{"location":{"type":"string","description":"City and country"},"unit":{"enum":["celsius","fahrenheit"]},"days":{"type":"integer","minimum":1,"maximum":14},"include_hourly":{"type":"boolean"}},"required":["location","unit"],"additionalProperties":false})j",
             R"j({"location": "Paris, France", "unit": "celsius", "days": 5, "include_hourly": false})j"},
            {"product_catalog", StructuredOutput::Kind::kJsonSchema,
             R"j({"type":"object","properties":{"products":{"type":"array","items":{"$ref":"#/$defs/product"},"minItems":1},"currency":{"type":"string","pattern":"^[A-Z]{3}$"}},"required":["products","currency"],"additionalProperties":false,"$defs":{"product":{"type":"object","properties":{"id":{"type":"string","format":"uuid"},"title":{"type":"string","maxLength":80},"price":{"type":"number","minimum":0},"tags":{"type":"array","items":{"type":"string"},"maxItems":5},"in_stock":{"type":"boolean"}},"required":["id","title","price"],"additionalProperties":false}}})j",
             R"j({"products": [{"id": "3fa85f64-5717-4562-b3fc-2c963f66afa6", "title": "Wireless mouse, ergonomic", "price": 24.99, "tags": ["electronics", "office"], "in_stock": true}, {"id": "9b2e7c1a-0d4f-4e7b-8a55-1f2d3c4b5a6e", "title": "USB-C cable (2 m)", "price": 9.5, "in_stock": false}], "currency": "EUR"})j"},
            {"event", StructuredOutput::Kind::kJsonSchema,
             R"j({"type":"object","properties":{"title":{"type":"string"},"start":{"type":"string","format":"date-time"},"end":{"type":"string","format":"date-time"},"attendees":{"type":"array","items":{"type":"object","properties":{"name":{"type":"string"},"role":{"enum":["organizer","speaker","guest"]}},"required":["name","role"],"additionalProperties":false}},"location":{"anyOf":[{"type":"string"},{"type":"null"}]}},"required":["title","start","end","attendees","location"],"additionalProperties":false})j",
             R"j({"title": "Quarterly planning", "start": "2025-03-04T09:30:00Z", "end": "2025-03-04T11:00:00+01:00", "attendees": [{"name": "Grace Hopper", "role": "organizer"}, {"name": "Alan Turing", "role": "speaker"}, {"name": "Edsger Dijkstra", "role": "guest"}], "location": null})j"},
            {"review_analysis", StructuredOutput::Kind::kJsonSchema, R"j({"type":"object","properties":{"sentiment":{"enum":["positive","negative","neutral","mixed"]},"score":{"type":"number","minimum":-1,"maximum":1},"aspects":{"type":"array","items":{"type":"object","properties":{"aspect":{"type":"string"},"opinion":{"type":"string"},"polarity":{"enum":["positive","negative","neutral"]}},"required":["aspect","opinion","polarity"],"additionalProperties":false},"maxItems":10},"summary":{"type":"string","maxLength":200}},"required":["sentiment","score","aspects","summary"],"additionalProperties":false})j",
             R"j({"sentiment": "mixed", "score": 0.25, "aspects": [{"aspect": "battery life", "opinion": "lasts two full days", "polarity": "positive"}, {"aspect": "screen", "opinion": "too dim outdoors", "polarity": "negative"}], "summary": "Great battery, but the display struggles in sunlight; overall decent value."})j"},
            {"address_book", StructuredOutput::Kind::kJsonSchema,
             R"j({"$defs":{"address":{"type":"object","properties":{"street":{"type":"string"},"city":{"type":"string"},"zip":{"type":"string","pattern":"^[0-9]{5}$"},"country":{"type":"string","minLength":2,"maxLength":2}},"required":["street","city","country"],"additionalProperties":false}},"type":"object","properties":{"contacts":{"type":"array","items":{"type":"object","properties":{"name":{"type":"string"},"phones":{"type":"array","items":{"type":"string","pattern":"^\\+?[0-9 -]{6,20}$"}},"home":{"$ref":"#/$defs/address"},"work":{"$ref":"#/$defs/address"}},"required":["name"],"additionalProperties":false}}},"required":["contacts"],"additionalProperties":false})j",
             R"j({"contacts": [{"name": "Marie Curie", "phones": ["+33 1 42 34 56 78"], "home": {"street": "36 Quai de Béthune", "city": "Paris", "zip": "75004", "country": "FR"}}, {"name": "Niels Bohr", "work": {"street": "Blegdamsvej 17", "city": "København", "country": "DK"}}]})j"},
            {"json_object", StructuredOutput::Kind::kJsonObject, "",
             R"j({"answer": "The capital of Australia is Canberra.", "confidence": 0.93, "sources": ["https://en.wikipedia.org/wiki/Canberra"], "extra": {"population": 467194, "founded": 1913}})j"},
            {"regex_phone", StructuredOutput::Kind::kRegex, R"j(\(\d{3}\) \d{3}-\d{4})j",
             "(555) 123-4567"},
};

double Percentile(std::vector<double> v, double p) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v[std::min(v.size() - 1, static_cast<size_t>(p * (v.size() - 1) + 0.5))];
}

double Average(const std::vector<double>& v) {
  double s = 0;
  for (double x : v) s += x;
  return v.empty() ? 0 : s / v.size();
}

double MicrosSince(std::chrono::steady_clock::time_point t) {
  return std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t).count();
}

// This thread's CPU time in microseconds: on a shared machine, wall time also counts the time
// other processes hold the cores.
double ThreadCpuMicros() {
  timespec ts;
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return ts.tv_sec * 1e6 + ts.tv_nsec / 1e3;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr, "usage: grammar_bench MODEL_DIR [VOCAB_SIZE] [PASSES]\n");
    return 2;
  }
  const int32_t vocab_size = argc > 2 ? std::atoi(argv[2]) : 129280;
  const int passes = argc > 3 ? std::atoi(argv[3]) : 5;
  auto tokenizer = deepinfer::tokenizer::Tokenizer::FromDirectory(argv[1]);
  if (!tokenizer.ok()) {
    std::fprintf(stderr, "%s\n", tokenizer.status().ToString().c_str());
    return 1;
  }
  std::vector<int32_t> stops;
  if (auto eos = deepinfer::tokenizer::TokenContent((*tokenizer)->config(), "eos_token")) {
    if (auto id = (*tokenizer)->TokenToId(*eos)) stops.push_back(static_cast<int32_t>(*id));
  }
  auto t0 = std::chrono::steady_clock::now();
  auto vocab = deepinfer::grammar::TokenVocabulary::FromTokenizer(**tokenizer, vocab_size, stops);
  if (!vocab.ok()) {
    std::fprintf(stderr, "%s\n", vocab.status().ToString().c_str());
    return 1;
  }
  std::printf(
      "vocabulary: %d rows, %zu tokens with bytes (a trie of %d nodes), %zu stop tokens, built "
      "in %.1f ms\n",
      (*vocab)->size(), (*vocab)->sorted().size(), (*vocab)->trie_size(), stops.size(),
      MicrosSince(t0) / 1000);

  std::vector<double> compile_us, cold_us, warm_us;
  std::vector<double> compile_cpu_us, cold_cpu_us, warm_cpu_us;
  std::vector<uint32_t> mask((*vocab)->mask_words());
  for (const Case& c : kCases) {
    StructuredOutput spec;
    spec.kind = c.kind;
    spec.text = c.spec;
    std::shared_ptr<const deepinfer::grammar::CompiledGrammar> grammar;
    std::vector<double> this_compile;
    for (int i = 0; i < 21; ++i) {
      t0 = std::chrono::steady_clock::now();
      const double c0 = ThreadCpuMicros();
      auto compiled = deepinfer::grammar::CompileStructuredOutput(spec);
      this_compile.push_back(MicrosSince(t0));
      compile_cpu_us.push_back(ThreadCpuMicros() - c0);
      if (!compiled.ok()) {
        std::fprintf(stderr, "%s: %s\n", c.name, compiled.status().ToString().c_str());
        return 1;
      }
      grammar = *compiled;
    }
    compile_us.insert(compile_us.end(), this_compile.begin(), this_compile.end());
    const std::vector<uint32_t> ids = (*tokenizer)->Encode(c.document, false);
    auto cache = std::make_shared<deepinfer::grammar::TokenMaskCache>(grammar, *vocab);
    std::vector<double> this_cold, this_warm;
    for (int pass = 0; pass < passes; ++pass) {
      deepinfer::grammar::GrammarMatcher matcher(cache);
      std::vector<int32_t> tokens(ids.begin(), ids.end());
      if (!stops.empty()) tokens.push_back(stops[0]);
      for (int32_t token : tokens) {
        t0 = std::chrono::steady_clock::now();
        const double c0 = ThreadCpuMicros();
        matcher.FillNextTokenBitmask(mask.data());
        (pass == 0 ? this_cold : this_warm).push_back(MicrosSince(t0));
        (pass == 0 ? cold_cpu_us : warm_cpu_us).push_back(ThreadCpuMicros() - c0);
        if (!(mask[token >> 5] >> (token & 31) & 1) || !matcher.AcceptToken(token)) {
          std::fprintf(stderr, "%s: token %d ('%s') of the document is not allowed\n", c.name,
                       token, (*vocab)->bytes(token).c_str());
          return 1;
        }
      }
      if (!matcher.IsTerminated() && !stops.empty()) {
        std::fprintf(stderr, "%s: the document did not end the grammar\n", c.name);
        return 1;
      }
    }
    std::printf(
        "%-16s %3zu tokens  compile p50 %7.1f us  mask first pass avg %8.1f us p99 %8.1f us  "
        "warm avg %6.1f us p50 %6.1f us p99 %6.1f us\n",
        c.name, ids.size() + 1, Percentile(this_compile, 0.5), Average(this_cold),
        Percentile(this_cold, 0.99), Average(this_warm), Percentile(this_warm, 0.5),
        Percentile(this_warm, 0.99));
    cold_us.insert(cold_us.end(), this_cold.begin(), this_cold.end());
    warm_us.insert(warm_us.end(), this_warm.begin(), this_warm.end());
  }
  std::printf(
      "all, wall time: compile p50 %.1f us; mask first pass avg %.1f us p50 %.1f us "
      "p99 %.1f us; warm avg %.1f us p50 %.1f us p99 %.1f us (%zu warm masks)\n",
      Percentile(compile_us, 0.5), Average(cold_us), Percentile(cold_us, 0.5),
      Percentile(cold_us, 0.99), Average(warm_us), Percentile(warm_us, 0.5),
      Percentile(warm_us, 0.99), warm_us.size());
  std::printf(
      "all, thread CPU time: compile p50 %.1f us; mask first pass avg %.1f us p50 %.1f us "
      "p99 %.1f us; warm avg %.1f us p50 %.1f us p99 %.1f us\n",
      Percentile(compile_cpu_us, 0.5), Average(cold_cpu_us), Percentile(cold_cpu_us, 0.5),
      Percentile(cold_cpu_us, 0.99), Average(warm_cpu_us), Percentile(warm_cpu_us, 0.5),
      Percentile(warm_cpu_us, 0.99));
  return 0;
}
