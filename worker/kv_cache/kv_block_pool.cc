// KvBlockPool: per-layer memory from the spec, free-list allocation of blocks.
#include "worker/kv_cache/kv_block_pool.h"

#include <algorithm>
#include <atomic>
#include <utility>

#include "absl/strings/str_cat.h"
#include "glog/logging.h"

namespace deepinfer {
namespace {

std::atomic<uint64_t> next_pool_id{0};

}  // namespace

absl::StatusOr<WeightDType> ResolveKvCacheDType(const std::string& name, WeightDType weight_dtype) {
  if (name.empty() || name == "auto") return weight_dtype;
  if (name == "float32" || name == "fp32") return WeightDType::kFloat32;
  if (name == "bfloat16" || name == "bf16") return WeightDType::kBFloat16;
  if (name == "fp8" || name == "fp8_e4m3" || name == "float8_e4m3") return WeightDType::kFp8E4M3;
  return absl::InvalidArgumentError(absl::StrCat("unknown KV cache dtype '", name,
                                                 "' (expected auto, bfloat16, float32 or fp8)"));
}

absl::StatusOr<std::unique_ptr<KvBlockPool>> KvBlockPool::Create(Backend* backend,
                                                                 const KvBlockPoolOptions& o) {
  if (absl::Status st = o.spec.Validate(); !st.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("KvBlockPool: ", st.message()));
  }
  if (o.num_blocks <= 0 || o.block_size <= 0) {
    return absl::InvalidArgumentError(absl::StrCat("KvBlockPool: bad size blocks=", o.num_blocks,
                                                   " block_size=", o.block_size, " for ",
                                                   o.spec.ToString()));
  }
  if (absl::Status st = o.spec.ValidateBlockSize(o.block_size); !st.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("KvBlockPool: ", st.message()));
  }
  int32_t slots = 0;
  if (o.spec.StateBytesPerSequence() > 0) {
    if (o.max_sequences < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("KvBlockPool: max_sequences ", o.max_sequences, " is negative"));
    }
    slots = o.max_sequences > 0 ? o.max_sequences : std::min(o.num_blocks, 64);
  }
  std::vector<std::unique_ptr<DeviceBuffer>> layers(o.spec.num_layers());
  std::vector<std::unique_ptr<DeviceBuffer>> state(o.spec.num_layers());
  for (const KvCacheGroupSpec& g : o.spec.groups) {
    const size_t bytes = static_cast<size_t>(o.num_blocks) * g.BlockBytes(o.block_size);
    const size_t state_bytes = static_cast<size_t>(slots) * g.StateBytes();
    for (int32_t l : g.layers) {
      layers[l] = backend->Allocate(std::max<size_t>(bytes, 1));
      if (state_bytes > 0) state[l] = backend->Allocate(state_bytes);
    }
  }
  return std::unique_ptr<KvBlockPool>(
      new KvBlockPool(backend, o, std::move(layers), std::move(state), slots));
}

KvBlockPool::KvBlockPool(Backend* backend, const KvBlockPoolOptions& options,
                         std::vector<std::unique_ptr<DeviceBuffer>> layers,
                         std::vector<std::unique_ptr<DeviceBuffer>> state, int32_t num_state_slots)
    : backend_(backend),
      options_(options),
      id_(next_pool_id.fetch_add(1) + 1),
      layers_(std::move(layers)),
      state_(std::move(state)),
      num_state_slots_(num_state_slots) {
  group_of_.resize(layers_.size());
  for (size_t g = 0; g < options_.spec.groups.size(); ++g) {
    for (int32_t l : options_.spec.groups[g].layers) group_of_[l] = g;
  }
  absl::MutexLock lock(&mu_);
  in_use_.assign(options_.num_blocks, 0);
  slot_of_block_.assign(options_.num_blocks, -1);
  for (int32_t s = num_state_slots_ - 1; s >= 0; --s) free_slots_.push_back(s);
  // Hand out low ids first (pop from the back).
  for (int32_t b = options_.num_blocks - 1; b >= 0; --b) free_.push_back(b);
}

absl::StatusOr<std::vector<int32_t>> KvBlockPool::Allocate(int32_t n) {
  absl::MutexLock lock(&mu_);
  if (n < 0 || static_cast<size_t>(n) > free_.size()) {
    return absl::ResourceExhaustedError(
        absl::StrCat("KvBlockPool: asked for ", n, " blocks, ", free_.size(), " free"));
  }
  std::vector<int32_t> out;
  out.reserve(n);
  for (int32_t i = 0; i < n; ++i) {
    out.push_back(free_.back());
    free_.pop_back();
    in_use_[out.back()] = 1;
  }
  return out;
}

absl::Status KvBlockPool::Free(const std::vector<int32_t>& blocks) {
  absl::MutexLock lock(&mu_);
  std::vector<char> seen(options_.num_blocks, 0);
  for (int32_t b : blocks) {
    if (b < 0 || b >= options_.num_blocks || !in_use_[b] || seen[b]) {
      return absl::InvalidArgumentError(
          absl::StrCat("KvBlockPool: block ", b, " is not allocated (double free?)"));
    }
    seen[b] = 1;
  }
  for (int32_t b : blocks) {
    in_use_[b] = 0;
    free_.push_back(b);
    if (slot_of_block_[b] >= 0) {
      free_slots_.push_back(slot_of_block_[b]);
      slot_of_block_[b] = -1;
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<int32_t> KvBlockPool::SequenceSlot(int32_t key_block, bool* fresh) {
  absl::MutexLock lock(&mu_);
  if (fresh != nullptr) *fresh = false;
  if (num_state_slots_ == 0) {
    return absl::FailedPreconditionError(
        absl::StrCat("KvBlockPool: ", options_.spec.ToString(), " keeps no per-sequence state"));
  }
  if (key_block < 0 || key_block >= options_.num_blocks || !in_use_[key_block]) {
    return absl::InvalidArgumentError(
        absl::StrCat("KvBlockPool: block ", key_block, " is not allocated"));
  }
  if (slot_of_block_[key_block] >= 0) return slot_of_block_[key_block];
  if (free_slots_.empty()) {
    return absl::ResourceExhaustedError(
        absl::StrCat("KvBlockPool: all ", num_state_slots_, " sequence state slots are in use"));
  }
  slot_of_block_[key_block] = free_slots_.back();
  free_slots_.pop_back();
  if (fresh != nullptr) *fresh = true;
  return slot_of_block_[key_block];
}

void KvBlockPool::ReleaseSequenceSlot(int32_t key_block) {
  absl::MutexLock lock(&mu_);
  if (key_block < 0 || key_block >= options_.num_blocks || slot_of_block_[key_block] < 0) return;
  free_slots_.push_back(slot_of_block_[key_block]);
  slot_of_block_[key_block] = -1;
}

size_t KvBlockPool::BlockBytes() const {
  size_t bytes = 0;
  for (size_t l = 0; l < layers_.size(); ++l) {
    bytes += LayerGroup(static_cast<int32_t>(l)).BlockBytes(options_.block_size);
  }
  return bytes;
}

void KvBlockPool::ReadBlock(int32_t block, std::string* out) const {
  CHECK(block >= 0 && block < options_.num_blocks) << "block " << block;
  out->resize(BlockBytes());
  size_t at = 0;
  for (size_t l = 0; l < layers_.size(); ++l) {
    const char* base = static_cast<const char*>(layers_[l]->data());
    for (int64_t region : BlockRegions(static_cast<int32_t>(l))) {
      backend_->CopyToHost(base + block * region, region, out->data() + at);
      at += region;
      base += options_.num_blocks * region;
    }
  }
  CHECK_EQ(at, out->size());
  backend_->Synchronize();
}

void KvBlockPool::WriteBlock(int32_t block, const std::string& data) const {
  CHECK(block >= 0 && block < options_.num_blocks) << "block " << block;
  CHECK_EQ(data.size(), BlockBytes());
  size_t at = 0;
  for (size_t l = 0; l < layers_.size(); ++l) {
    char* base = static_cast<char*>(layers_[l]->data());
    for (int64_t region : BlockRegions(static_cast<int32_t>(l))) {
      backend_->CopyToDevice(data.data() + at, region, base + block * region);
      at += region;
      base += options_.num_blocks * region;
    }
  }
  backend_->Synchronize();
}

int32_t KvBlockPool::BlocksFor(int64_t num_tokens) const {
  return static_cast<int32_t>((num_tokens + options_.block_size - 1) / options_.block_size);
}

int32_t KvBlockPool::num_free_blocks() const {
  absl::MutexLock lock(&mu_);
  return static_cast<int32_t>(free_.size());
}

PagedLatentCacheView KvBlockPool::LayerView(int32_t layer) const {
  const KvCacheGroupSpec& g = LayerGroup(layer);
  CHECK(g.kind == KvCacheKind::kPagedLatent)
      << "layer " << layer << " caches " << KvCacheKindName(g.kind) << ", not paged_latent";
  PagedLatentCacheView v;
  v.cache = layers_[layer]->data();
  v.block_size = options_.block_size;
  v.latent_dim = g.latent_dim;
  v.rope_dim = g.rope_dim;
  v.dtype = g.dtype;
  return v;
}

std::vector<int64_t> KvBlockPool::BlockRegions(int32_t layer) const {
  const KvCacheGroupSpec& g = LayerGroup(layer);
  const int32_t bs = options_.block_size;
  if (g.kind == KvCacheKind::kPagedLatent) return {g.BlockBytes(bs)};
  return {g.CompressedFloatsPerBlock(bs) * 4, g.IndexFloatsPerBlock(bs) * 4};
}

absl::Status KvBlockPool::CheckAllocated(const std::vector<int32_t>& blocks) const {
  absl::MutexLock lock(&mu_);
  for (int32_t b : blocks) {
    if (b < 0 || b >= options_.num_blocks || !in_use_[b]) {
      return absl::InvalidArgumentError(
          absl::StrCat("KvBlockPool: block ", b, " is not allocated"));
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<std::vector<char>> KvBlockPool::ReadBlocks(
    const std::vector<int32_t>& blocks) const {
  if (absl::Status st = CheckAllocated(blocks); !st.ok()) return st;
  std::vector<char> out(blocks.size() * options_.spec.BytesPerBlock(options_.block_size));
  char* at = out.data();
  for (size_t l = 0; l < layers_.size(); ++l) {
    const char* base = static_cast<const char*>(layers_[l]->data());
    for (int64_t region : BlockRegions(static_cast<int32_t>(l))) {
      for (int32_t b : blocks) {
        backend_->CopyToHost(base + b * region, region, at);
        at += region;
      }
      base += options_.num_blocks * region;
    }
  }
  CHECK_EQ(at, out.data() + out.size());
  return out;
}

absl::Status KvBlockPool::WriteBlocks(const std::vector<int32_t>& blocks,
                                      const std::vector<char>& bytes) {
  if (absl::Status st = CheckAllocated(blocks); !st.ok()) return st;
  const size_t want = blocks.size() * options_.spec.BytesPerBlock(options_.block_size);
  if (bytes.size() != want) {
    return absl::InvalidArgumentError(
        absl::StrCat("KvBlockPool: ", bytes.size(), " bytes for ", blocks.size(), " blocks of ",
                     want / std::max<size_t>(1, blocks.size()), " bytes"));
  }
  const char* at = bytes.data();
  for (size_t l = 0; l < layers_.size(); ++l) {
    char* base = static_cast<char*>(layers_[l]->data());
    for (int64_t region : BlockRegions(static_cast<int32_t>(l))) {
      for (int32_t b : blocks) {
        backend_->CopyToDevice(at, region, base + b * region);
        at += region;
      }
      base += options_.num_blocks * region;
    }
  }
  return absl::OkStatus();
}

}  // namespace deepinfer
