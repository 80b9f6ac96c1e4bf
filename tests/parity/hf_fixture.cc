// HfFixture: expected.json / logits.bin reader.
#include "tests/parity/hf_fixture.h"

#include <cstdlib>
#include <fstream>
#include <sstream>

#include "gtest/gtest.h"
#include "nlohmann/json.hpp"

namespace deepinfer {
namespace {

// Reads expected.json without throwing accessors; missing or mistyped fields leave the fixture
// empty, which the test reports as a failure.
std::vector<int32_t> IntList(const nlohmann::json& obj, const char* key) {
  std::vector<int32_t> out;
  auto it = obj.find(key);
  if (it == obj.end() || !it->is_array()) return out;
  for (const auto& v : *it) {
    if (v.is_number_integer()) out.push_back(v.get<int32_t>());
  }
  return out;
}

int64_t IntField(const nlohmann::json& obj, const char* key) {
  auto it = obj.find(key);
  return it != obj.end() && it->is_number_integer() ? it->get<int64_t>() : -1;
}

}  // namespace

Fixture LoadFixture(const std::string& name) {
  Fixture f;
  const char* src = std::getenv("TEST_SRCDIR");
  f.dir = std::string(src ? src : ".") + "/deepinfer/tests/fixtures/" + name;
  std::ifstream in(f.dir + "/expected.json");
  std::stringstream ss;
  ss << in.rdbuf();
  nlohmann::json j = nlohmann::json::parse(ss.str(), nullptr, /*allow_exceptions=*/false);
  EXPECT_TRUE(j.is_object()) << f.dir;
  if (!j.is_object()) return f;
  f.vocab = IntField(j, "vocab_size");
  const int64_t rows = IntField(j, "logits_rows");
  EXPECT_GT(f.vocab, 0);
  EXPECT_GT(rows, 0);
  if (f.vocab <= 0 || rows <= 0) return f;
  f.logits.resize(rows * f.vocab);
  std::ifstream bin(f.dir + "/logits.bin", std::ios::binary);
  bin.read(reinterpret_cast<char*>(f.logits.data()), f.logits.size() * sizeof(float));
  EXPECT_EQ(bin.gcount(), static_cast<std::streamsize>(f.logits.size() * sizeof(float)));
  auto prompts = j.find("prompts");
  if (prompts == j.end() || !prompts->is_array()) return f;
  for (const auto& p : *prompts) {
    if (!p.is_object()) continue;
    FixturePrompt fp;
    fp.ids = IntList(p, "ids");
    fp.logits_row_offset = IntField(p, "logits_row_offset");
    fp.greedy = IntList(p, "greedy_24");
    EXPECT_GE(fp.ids.size(), 5u);
    EXPECT_EQ(fp.greedy.size(), 24u);
    EXPECT_GE(fp.logits_row_offset, 0);
    EXPECT_LE(fp.logits_row_offset + static_cast<int64_t>(fp.ids.size()), rows);
    f.prompts.push_back(std::move(fp));
  }
  return f;
}

}  // namespace deepinfer
