// KvCacheSpec arithmetic and checks.
#include "worker/kv_cache/kv_cache_spec.h"

#include <algorithm>
#include <map>

#include "absl/strings/str_cat.h"

namespace deepinfer {

const char* KvCacheKindName(KvCacheKind kind) {
  switch (kind) {
    case KvCacheKind::kPagedLatent:
      return "paged_latent";
  }
  return "?";
}

PrefixReuse KvCacheKindPrefixReuse(KvCacheKind kind) {
  switch (kind) {
    case KvCacheKind::kPagedLatent:
      return PrefixReuse::kShareBlocks;
  }
  return PrefixReuse::kBoundedReplay;
}

int64_t KvCacheGroupSpec::EntryBytes() const {
  switch (kind) {
    case KvCacheKind::kPagedLatent:
      return static_cast<int64_t>(latent_dim + rope_dim) *
             static_cast<int64_t>(WeightDTypeSize(dtype));
  }
  return 0;
}

int64_t KvCacheGroupSpec::BlockBytes(int32_t block_size) const { return EntryBytes() * block_size; }

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

KvCacheSpec KvCacheSpec::WithDType(WeightDType dtype) const {
  KvCacheSpec out = *this;
  for (KvCacheGroupSpec& g : out.groups) g.dtype = dtype;
  return out;
}

std::string KvCacheSpec::ToString() const {
  std::string out;
  for (const KvCacheGroupSpec& g : groups) {
    absl::StrAppend(&out, out.empty() ? "" : ", ", KvCacheKindName(g.kind), " x", g.layers.size(),
                    " layers (", g.latent_dim, "+", g.rope_dim, ", ", WeightDTypeName(g.dtype),
                    ")");
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
