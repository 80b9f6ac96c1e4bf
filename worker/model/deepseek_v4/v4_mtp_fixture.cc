// V4MtpFixture: the fixture's files with a generated MTP module.
#include "worker/model/deepseek_v4/v4_mtp_fixture.h"

#include <cstdlib>
#include <fstream>
#include <sstream>
#include <utility>

#include "absl/strings/str_cat.h"
#include "nlohmann/json.hpp"
#include "worker/model/dummy_weight_source.h"
#include "worker/model/model_loader.h"

namespace deepinfer {
namespace {

std::string ReadFile(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// The fixture's tensors, the dummy source's for the MTP module's.
class WithGeneratedMtp : public WeightSource {
 public:
  explicit WithGeneratedMtp(std::unique_ptr<WeightSource> base)
      : base_(std::move(base)), dummy_(7) {}
  absl::Status ReadFloat32(const std::string& name, const std::vector<int64_t>& shape,
                           float* out) override {
    return Mtp(name) ? dummy_.ReadFloat32(name, shape, out) : base_->ReadFloat32(name, shape, out);
  }
  bool Contains(const std::string& name) const override {
    return Mtp(name) || base_->Contains(name);
  }
  absl::StatusOr<WeightStorage> Storage(const std::string& name) override {
    return Mtp(name) ? dummy_.Storage(name) : base_->Storage(name);
  }
  absl::Status ReadIndices(const std::string& name, const std::vector<int64_t>& shape,
                           int64_t bound, int32_t* out) override {
    return base_->ReadIndices(name, shape, bound, out);
  }
  std::optional<DummyFill> DummyFillFor(const std::string& name,
                                        const std::vector<int64_t>& shape) const override {
    return Mtp(name) ? dummy_.DummyFillFor(name, shape) : std::nullopt;
  }
  std::string description() const override { return base_->description() + " + generated MTP"; }

 private:
  static bool Mtp(const std::string& name) { return name.rfind("mtp.", 0) == 0; }
  std::unique_ptr<WeightSource> base_;
  DummyWeightSource dummy_;
};

}  // namespace

absl::StatusOr<V4MtpFixture> OpenV4MtpFixture(const std::string& name, int64_t speculative_tokens) {
  const char* src = std::getenv("TEST_SRCDIR");
  const std::string dir = absl::StrCat(src ? src : ".", "/deepinfer/tests/fixtures/", name);
  ModelConfig opened;
  absl::StatusOr<std::unique_ptr<WeightSource>> source = OpenWeightSource(dir, &opened);
  if (!source.ok()) return source.status();
  nlohmann::json json = nlohmann::json::parse(ReadFile(dir + "/config.json"), nullptr, false);
  if (!json.is_object()) return absl::NotFoundError(absl::StrCat(dir, "/config.json"));
  json["num_nextn_predict_layers"] = 1;
  absl::StatusOr<ModelConfig> config = ModelConfig::FromJson(json.dump(), dir + "/config.json");
  if (!config.ok()) return config.status();
  V4MtpFixture f;
  f.config = *std::move(config);
  f.config.num_draft_layers = 1;
  f.config.speculative_tokens = speculative_tokens;
  f.source = std::make_unique<WithGeneratedMtp>(*std::move(source));
  nlohmann::json expected = nlohmann::json::parse(ReadFile(dir + "/expected.json"), nullptr, false);
  if (!expected.is_object() || !expected.contains("prompts")) {
    return absl::NotFoundError(absl::StrCat(dir, "/expected.json has no prompts"));
  }
  for (const auto& p : expected["prompts"]) {
    f.prompts.push_back(
        {p["ids"].get<std::vector<int32_t>>(), p["greedy_24"].get<std::vector<int32_t>>()});
  }
  return f;
}

}  // namespace deepinfer
