// KvCacheSpec arithmetic and checks.
#include "worker/kv_cache/kv_cache_spec.h"

#include <algorithm>
#include <map>
#include <numeric>

#include "absl/strings/str_cat.h"
#include "worker/backend/fp8_latent_entry.h"

namespace deepinfer {

const char* KvCacheKindName(KvCacheKind kind) {
  switch (kind) {
    case KvCacheKind::kPagedLatent:
      return "paged_latent";
    case KvCacheKind::kSlidingWindow:
      return "sliding_window";
    case KvCacheKind::kCompressed:
      return "compressed";
    case KvCacheKind::kCompressedSparse:
      return "compressed_sparse";
  }
  return "?";
}

namespace {

int64_t CeilDiv(int64_t a, int64_t b) { return (a + b - 1) / b; }

}  // namespace

PrefixReuse KvCacheKindPrefixReuse(KvCacheKind kind) {
  switch (kind) {
    case KvCacheKind::kPagedLatent:
      return PrefixReuse::kShareBlocks;
    case KvCacheKind::kSlidingWindow:
    case KvCacheKind::kCompressed:
    case KvCacheKind::kCompressedSparse:
      return PrefixReuse::kBoundedReplay;
  }
  return PrefixReuse::kBoundedReplay;
}

int64_t KvCacheGroupSpec::EntryBytes() const {
  switch (kind) {
    case KvCacheKind::kPagedLatent:
      if (dtype == WeightDType::kFp8E4M3) return Fp8LatentLayout(latent_dim, rope_dim).bytes;
      return static_cast<int64_t>(latent_dim + rope_dim) *
             static_cast<int64_t>(WeightDTypeSize(dtype));
    case KvCacheKind::kSlidingWindow:
      return 0;
    case KvCacheKind::kCompressed:
    case KvCacheKind::kCompressedSparse:
      return CeilDiv(int64_t{head_dim + index_dim} * 4, ratio);
  }
  return 0;
}

int64_t KvCacheGroupSpec::BlockBytes(int32_t block_size) const {
  switch (kind) {
    case KvCacheKind::kPagedLatent:
      return EntryBytes() * block_size;
    case KvCacheKind::kSlidingWindow:
    case KvCacheKind::kCompressed:
    case KvCacheKind::kCompressedSparse:
      return (CompressedFloatsPerBlock(block_size) + IndexFloatsPerBlock(block_size)) * 4;
  }
  return 0;
}

int64_t KvCacheGroupSpec::CompressedFloatsPerBlock(int32_t block_size) const {
  if (kind != KvCacheKind::kCompressed && kind != KvCacheKind::kCompressedSparse) return 0;
  return CeilDiv(int64_t{block_size} * head_dim, ratio);
}

int64_t KvCacheGroupSpec::IndexFloatsPerBlock(int32_t block_size) const {
  if (kind != KvCacheKind::kCompressedSparse) return 0;
  return CeilDiv(int64_t{block_size} * index_dim, ratio);
}

int64_t KvCacheGroupSpec::compressor_rows() const {
  switch (kind) {
    case KvCacheKind::kCompressed:
      return int64_t{ratio} + spare_rows;
    case KvCacheKind::kCompressedSparse:
      return 2 * int64_t{ratio} + spare_rows;
    default:
      return 0;
  }
}

int64_t KvCacheGroupSpec::compressor_width() const {
  // kv then gate; the sparse kind projects two series (its own window's and the next one's).
  return kind == KvCacheKind::kCompressedSparse ? 4 * int64_t{head_dim} : 2 * int64_t{head_dim};
}

int64_t KvCacheGroupSpec::indexer_width() const {
  return kind == KvCacheKind::kCompressedSparse ? 4 * int64_t{index_dim} : 0;
}

int64_t KvCacheGroupSpec::StateFloats() const {
  if (kind == KvCacheKind::kPagedLatent) return 0;
  return indexer_state_offset() + compressor_rows() * indexer_width();
}

int64_t KvCacheSpec::BytesPerToken() const {
  int64_t bytes = 0;
  for (const KvCacheGroupSpec& g : groups) {
    bytes += g.EntryBytes() * static_cast<int64_t>(g.layers.size());
  }
  return bytes;
}

int64_t KvCacheSpec::BytesPerBlock(int32_t block_size) const {
  int64_t bytes = 0;
  for (const KvCacheGroupSpec& g : groups) {
    bytes += g.BlockBytes(block_size) * static_cast<int64_t>(g.layers.size());
  }
  return bytes;
}

int64_t KvCacheSpec::StateBytesPerSequence() const {
  int64_t bytes = 0;
  for (const KvCacheGroupSpec& g : groups) {
    bytes += g.StateBytes() * static_cast<int64_t>(g.layers.size());
  }
  return bytes;
}

absl::Status KvCacheSpec::ValidateBlockSize(int32_t block_size) const {
  for (const KvCacheGroupSpec& g : groups) {
    if (g.kind != KvCacheKind::kCompressed && g.kind != KvCacheKind::kCompressedSparse) continue;
    if ((int64_t{block_size} * g.head_dim) % g.ratio != 0 ||
        (int64_t{block_size} * g.index_dim) % g.ratio != 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          "KV cache spec: block size ", block_size, " does not page ", KvCacheKindName(g.kind),
          " entries of ", g.head_dim, "+", g.index_dim, " floats per ", g.ratio, " positions"));
    }
  }
  return absl::OkStatus();
}

int32_t KvCacheSpec::num_layers() const {
  int32_t n = 0;
  for (const KvCacheGroupSpec& g : groups) {
    for (int32_t l : g.layers) n = std::max(n, l + 1);
  }
  return n;
}

absl::Status KvCacheSpec::Validate() const {
  if (groups.empty()) return absl::InvalidArgumentError("KV cache spec: no layer group");
  std::map<int32_t, size_t> group_of;
  for (size_t i = 0; i < groups.size(); ++i) {
    const KvCacheGroupSpec& g = groups[i];
    if (g.layers.empty()) {
      return absl::InvalidArgumentError(absl::StrCat("KV cache spec: group ", i, " has no layers"));
    }
    for (int32_t l : g.layers) {
      if (l < 0 || !group_of.emplace(l, i).second) {
        return absl::InvalidArgumentError(
            absl::StrCat("KV cache spec: layer ", l, " is negative or in two groups"));
      }
    }
    switch (g.kind) {
      case KvCacheKind::kPagedLatent:
        if (g.latent_dim <= 0 || g.rope_dim < 0) {
          return absl::InvalidArgumentError(absl::StrCat("KV cache spec: group ", i,
                                                         " (paged_latent) has latent ",
                                                         g.latent_dim, " and rope ", g.rope_dim));
        }
        break;
      case KvCacheKind::kSlidingWindow:
      case KvCacheKind::kCompressed:
      case KvCacheKind::kCompressedSparse: {
        const bool compressed = g.kind != KvCacheKind::kSlidingWindow;
        const bool sparse = g.kind == KvCacheKind::kCompressedSparse;
        if (g.head_dim <= 0 || g.window <= 0 || (compressed && g.ratio <= 0) ||
            (sparse && g.index_dim <= 0) || g.spare_rows < 0) {
          return absl::InvalidArgumentError(
              absl::StrCat("KV cache spec: group ", i, " (", KvCacheKindName(g.kind),
                           ") has head_dim ", g.head_dim, ", window ", g.window, ", ratio ",
                           g.ratio, ", index_dim ", g.index_dim, ", spare rows ", g.spare_rows));
        }
        break;
      }
    }
  }
  if (static_cast<int32_t>(group_of.size()) != num_layers()) {
    return absl::InvalidArgumentError(absl::StrCat("KV cache spec: ", num_layers(),
                                                   " layers but only ", group_of.size(),
                                                   " of them in a group"));
  }
  return absl::OkStatus();
}

bool KvCacheSpec::SharesPrefixBlocks() const {
  for (const KvCacheGroupSpec& g : groups) {
    if (KvCacheKindPrefixReuse(g.kind) != PrefixReuse::kShareBlocks) return false;
  }
  return true;
}

int64_t KvCacheSpec::EntrySpan() const {
  int64_t span = 1;
  for (const KvCacheGroupSpec& g : groups) {
    if (g.kind != KvCacheKind::kCompressed && g.kind != KvCacheKind::kCompressedSparse) continue;
    span = std::lcm(span, int64_t{g.ratio});
  }
  return span;
}

absl::StatusOr<KvCacheSpec> KvCacheSpec::WithDType(WeightDType dtype) const {
  KvCacheSpec out = *this;
  for (KvCacheGroupSpec& g : out.groups) {
    if (g.kind == KvCacheKind::kPagedLatent) {
      g.dtype = dtype;
    } else if (dtype == WeightDType::kFp8E4M3) {
      // The V4 kinds' entries and state are float32 and have no FP8 layout.
      return absl::UnimplementedError(absl::StrCat(
          "--kv-cache-dtype fp8 applies to the MLA latent cache (paged_latent) only; this model's ",
          KvCacheKindName(g.kind), " cache (DeepSeek-V4 attention) has no FP8 layout: use auto, ",
          "bfloat16 or float32"));
    }
  }
  return out;
}

std::string KvCacheSpec::ToString() const {
  std::string out;
  for (const KvCacheGroupSpec& g : groups) {
    absl::StrAppend(&out, out.empty() ? "" : ", ", KvCacheKindName(g.kind), " x", g.layers.size(),
                    " layers (");
    switch (g.kind) {
      case KvCacheKind::kPagedLatent:
        absl::StrAppend(&out, g.latent_dim, "+", g.rope_dim, ", ", WeightDTypeName(g.dtype), ")");
        break;
      default:
        absl::StrAppend(&out, "head ", g.head_dim, ", window ", g.window);
        if (g.ratio > 0) absl::StrAppend(&out, ", ratio ", g.ratio);
        if (g.index_dim > 0) absl::StrAppend(&out, ", index ", g.index_dim);
        if (g.spare_rows > 0) absl::StrAppend(&out, ", spare rows ", g.spare_rows);
        absl::StrAppend(&out, ", float32)");
        break;
    }
  }
  return out;
}

KvCacheSpec PagedLatentSpec(int32_t num_layers, int32_t latent_dim, int32_t rope_dim,
                            WeightDType dtype) {
  KvCacheGroupSpec g;
  g.kind = KvCacheKind::kPagedLatent;
  for (int32_t l = 0; l < num_layers; ++l) g.layers.push_back(l);
  g.latent_dim = latent_dim;
  g.rope_dim = rope_dim;
  g.dtype = dtype;
  return KvCacheSpec{{g}};
}

}  // namespace deepinfer
