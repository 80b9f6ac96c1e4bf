// GatherFp8LatentCacheBf16 against the host: every copied entry has the bits of the host's
// DequantizeFp8LatentEntry rounded to bf16 (FloatToBf16Bits), the destination block tables name
// the blocks the rows were written to, and destination entries outside the rows keep their
// previous bytes. Host rows and token rows, the vectorised shape (DeepSeek-V3's latent 512 +
// rope 64) and one that goes a value at a time.
#include "kernels/attention/mla_fp8_gather.h"

#include <cuda_runtime_api.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <numeric>
#include <random>
#include <utility>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/testing/gpu_test_util.h"
#include "worker/backend/bf16.h"
#include "worker/backend/fp8_latent_entry.h"

namespace deepinfer {
namespace {

constexpr int32_t kBlock = 16;
constexpr uint16_t kPoison = 0xFFFF;  // a NaN no copied value has

// A device buffer freed at scope exit.
struct DeviceBytes {
  void* p = nullptr;
  explicit DeviceBytes(size_t n) { EXPECT_EQ(cudaMalloc(&p, std::max<size_t>(n, 1)), cudaSuccess); }
  ~DeviceBytes() { cudaFree(p); }
  template <typename T>
  T* as() const {
    return static_cast<T*>(p);
  }
};

// An FP8 cache of num_blocks blocks, every entry quantised from random values whose latent
// scale varies by 2^[-8, 8] from entry to entry, with `rows` shuffled block-table rows of
// max_blocks blocks each.
struct Source {
  int32_t latent = 0, rope = 0, max_blocks = 0, rows = 0;
  int64_t entry_bytes = 0;
  std::vector<uint8_t> cache;
  std::vector<int32_t> tables;

  Source(int32_t l, int32_t r, int32_t mb, int32_t nrows, uint32_t seed)
      : latent(l), rope(r), max_blocks(mb), rows(nrows) {
    const Fp8LatentEntryLayout layout = Fp8LatentLayout(latent, rope);
    entry_bytes = layout.bytes;
    const int32_t num_blocks = rows * max_blocks;
    const int64_t entries = int64_t{num_blocks} * kBlock;
    cache.assign(static_cast<size_t>(entries * entry_bytes), 0);
    std::vector<float> x =
        testing::RandomFloats(static_cast<size_t>(entries) * (latent + rope), seed);
    std::mt19937 gen(seed + 1);
    std::uniform_real_distribution<float> exponent(-8.0f, 8.0f);
    for (int64_t e = 0; e < entries; ++e) {
      float* v = x.data() + e * (latent + rope);
      const float m = std::exp2(exponent(gen));
      for (int32_t i = 0; i < latent; ++i) v[i] *= m;
      QuantizeFp8LatentEntry(v, latent, v + latent, rope, cache.data() + e * entry_bytes);
    }
    tables.resize(num_blocks);
    std::iota(tables.begin(), tables.end(), 0);
    std::shuffle(tables.begin(), tables.end(), gen);
  }

  kernels::PagedLatentCache View(void* device_cache) const {
    kernels::PagedLatentCache c;
    c.cache = device_cache;
    c.block_size = kBlock;
    c.latent_dim = latent;
    c.rope_dim = rope;
    c.type = kernels::LatentCacheType::kFp8E4M3;
    const Fp8LatentEntryLayout layout = Fp8LatentLayout(latent, rope);
    c.fp8_rope_offset = static_cast<int32_t>(layout.rope_offset);
    c.fp8_scale_offset = static_cast<int32_t>(layout.scale_offset);
    c.fp8_entry_bytes = static_cast<int32_t>(layout.bytes);
    return c;
  }

  // The bf16 bits of entry j of block-table row `row`, as the host reads them back.
  std::vector<uint16_t> Expected(int32_t row, int32_t j) const {
    const int64_t slot = int64_t{tables[row * max_blocks + j / kBlock]} * kBlock + j % kBlock;
    std::vector<float> f(latent + rope);
    DequantizeFp8LatentEntry(cache.data() + slot * entry_bytes, latent, rope, f.data());
    std::vector<uint16_t> bits(f.size());
    for (size_t i = 0; i < f.size(); ++i) bits[i] = FloatToBf16Bits(f[i]);
    return bits;
  }
};

// The copy of `rows` (src row, len, first destination block; table row = index) checked against
// the host: entries bit for bit, table columns, untouched entries elsewhere. dst_tables and dst
// are downloads of the destination (dst_blocks blocks, table_width columns).
void ExpectCopy(const Source& s, const std::vector<kernels::Fp8GatherRow>& rows,
                const std::vector<int32_t>& dst_tables, int32_t table_width,
                const std::vector<uint16_t>& dst, int64_t dst_blocks) {
  const int32_t dim = s.latent + s.rope;
  std::vector<bool> written(static_cast<size_t>(dst_blocks) * kBlock, false);
  for (size_t r = 0; r < rows.size(); ++r) {
    const kernels::Fp8GatherRow& row = rows[r];
    SCOPED_TRACE(::testing::Message() << "row " << r << " (source row " << row.src_row << ", "
                                      << row.len << " entries)");
    const int32_t blocks = (row.len + kBlock - 1) / kBlock;
    for (int32_t c = 0; c < table_width; ++c) {
      const int32_t want = row.dst_block + (c < blocks ? c : std::max(blocks - 1, 0));
      ASSERT_EQ(dst_tables[r * table_width + c], want) << "table column " << c;
    }
    for (int32_t j = 0; j < row.len; ++j) {
      const int64_t slot = int64_t{row.dst_block + j / kBlock} * kBlock + j % kBlock;
      written[slot] = true;
      const std::vector<uint16_t> want = s.Expected(row.src_row, j);
      for (int32_t i = 0; i < dim; ++i) {
        ASSERT_EQ(dst[slot * dim + i], want[i]) << "entry " << j << " value " << i;
      }
    }
  }
  for (int64_t slot = 0; slot < dst_blocks * kBlock; ++slot) {
    if (written[slot]) continue;
    for (int32_t i = 0; i < dim; ++i) {
      ASSERT_EQ(dst[slot * dim + i], kPoison) << "destination slot " << slot << " was written";
    }
  }
}

class MlaFp8GatherTest : public ::testing::TestWithParam<std::pair<int32_t, int32_t>> {};

TEST_P(MlaFp8GatherTest, HostRowsMatchTheHostBitForBit) {
  DEEPINFER_SKIP_WITHOUT_GPU();
  const uint32_t seed = testing::FreshSeed();
  SCOPED_TRACE(::testing::Message() << "seed " << seed);
  const auto [latent, rope] = GetParam();
  const int32_t max_blocks = 20;
  const Source s(latent, rope, max_blocks, /*rows=*/5, seed);
  // Packed rows, not in source order, one of them empty, one a whole table row, more rows than
  // one launch carries.
  std::vector<kernels::Fp8GatherRow> rows;
  const std::vector<int32_t> lens = {37, 300, 1, 0, 129, max_blocks * kBlock, 16, 17};
  int32_t next = 0;
  for (size_t i = 0; i < 70; ++i) {
    const int32_t len = lens[i % lens.size()];
    rows.push_back({static_cast<int32_t>((i * 3 + 1) % 5), len, next});
    next += std::max(1, (len + kBlock - 1) / kBlock) + static_cast<int32_t>(i % 2);
  }
  const int64_t dst_blocks = next + 1;
  const int32_t table_width = max_blocks;
  const int32_t dim = latent + rope;

  DeviceBytes dcache(s.cache.size()), dtables(s.tables.size() * sizeof(int32_t));
  DeviceBytes ddst(static_cast<size_t>(dst_blocks) * kBlock * dim * 2);
  DeviceBytes ddst_tables(rows.size() * table_width * sizeof(int32_t));
  DEEPINFER_CUDA_OK(cudaMemcpy(dcache.p, s.cache.data(), s.cache.size(), cudaMemcpyHostToDevice));
  DEEPINFER_CUDA_OK(cudaMemcpy(dtables.p, s.tables.data(), s.tables.size() * sizeof(int32_t),
                               cudaMemcpyHostToDevice));
  DEEPINFER_CUDA_OK(cudaMemset(ddst.p, 0xFF, static_cast<size_t>(dst_blocks) * kBlock * dim * 2));

  kernels::Fp8GatherParams p;
  p.src = s.View(dcache.p);
  p.block_tables = dtables.as<int32_t>();
  p.max_blocks_per_seq = max_blocks;
  p.rows = rows.data();
  p.num_rows = static_cast<int32_t>(rows.size());
  p.dst = ddst.as<uint16_t>();
  p.dst_blocks = dst_blocks;
  p.dst_tables = ddst_tables.as<int32_t>();
  p.table_width = table_width;
  DEEPINFER_CUDA_OK(kernels::GatherFp8LatentCacheBf16(p, nullptr));
  DEEPINFER_CUDA_OK(cudaDeviceSynchronize());

  std::vector<uint16_t> dst(static_cast<size_t>(dst_blocks) * kBlock * dim);
  std::vector<int32_t> dst_tables(rows.size() * table_width);
  DEEPINFER_CUDA_OK(cudaMemcpy(dst.data(), ddst.p, dst.size() * 2, cudaMemcpyDeviceToHost));
  DEEPINFER_CUDA_OK(
      cudaMemcpy(dst_tables.data(), ddst_tables.p, dst_tables.size() * 4, cudaMemcpyDeviceToHost));
  ExpectCopy(s, rows, dst_tables, table_width, dst, dst_blocks);

  // A row past the destination, or longer than the table, is refused before any launch.
  std::vector<kernels::Fp8GatherRow> bad = {{0, 17, static_cast<int32_t>(dst_blocks) - 1}};
  p.rows = bad.data();
  p.num_rows = 1;
  EXPECT_EQ(kernels::GatherFp8LatentCacheBf16(p, nullptr), cudaErrorInvalidValue);
  bad = {{0, table_width * kBlock + 1, 0}};
  EXPECT_EQ(kernels::GatherFp8LatentCacheBf16(p, nullptr), cudaErrorInvalidValue);
}

TEST_P(MlaFp8GatherTest, TokenRowsMatchTheHostBitForBit) {
  DEEPINFER_SKIP_WITHOUT_GPU();
  const uint32_t seed = testing::FreshSeed();
  SCOPED_TRACE(::testing::Message() << "seed " << seed);
  const auto [latent, rope] = GetParam();
  const int32_t max_blocks = 20;
  const Source s(latent, rope, max_blocks, /*rows=*/4, seed);
  // Decode tokens (one a row) and three of one sequence (a verify step's rows).
  const std::vector<int32_t> token_seq = {2, 0, 3, 3, 3, 1};
  const std::vector<int32_t> context_len = {5, 300, 126, 127, 128, max_blocks * kBlock};
  const int32_t tokens = static_cast<int32_t>(token_seq.size());
  const int32_t table_width = max_blocks, dim = latent + rope;
  const int64_t dst_blocks = int64_t{tokens} * table_width;

  DeviceBytes dcache(s.cache.size()), dtables(s.tables.size() * sizeof(int32_t));
  DeviceBytes dseq(tokens * sizeof(int32_t)), dctx(tokens * sizeof(int32_t));
  DeviceBytes dseq_out(tokens * sizeof(int32_t));
  DeviceBytes ddst(static_cast<size_t>(dst_blocks) * kBlock * dim * 2);
  DeviceBytes ddst_tables(static_cast<size_t>(tokens) * table_width * sizeof(int32_t));
  DEEPINFER_CUDA_OK(cudaMemcpy(dcache.p, s.cache.data(), s.cache.size(), cudaMemcpyHostToDevice));
  DEEPINFER_CUDA_OK(cudaMemcpy(dtables.p, s.tables.data(), s.tables.size() * sizeof(int32_t),
                               cudaMemcpyHostToDevice));
  DEEPINFER_CUDA_OK(
      cudaMemcpy(dseq.p, token_seq.data(), tokens * sizeof(int32_t), cudaMemcpyHostToDevice));
  DEEPINFER_CUDA_OK(
      cudaMemcpy(dctx.p, context_len.data(), tokens * sizeof(int32_t), cudaMemcpyHostToDevice));
  DEEPINFER_CUDA_OK(cudaMemset(ddst.p, 0xFF, static_cast<size_t>(dst_blocks) * kBlock * dim * 2));
  DEEPINFER_CUDA_OK(cudaMemset(dseq_out.p, 0xFF, tokens * sizeof(int32_t)));

  kernels::Fp8GatherParams p;
  p.src = s.View(dcache.p);
  p.block_tables = dtables.as<int32_t>();
  p.max_blocks_per_seq = max_blocks;
  p.token_seq = dseq.as<int32_t>();
  p.context_len = dctx.as<int32_t>();
  p.token_seq_out = dseq_out.as<int32_t>();
  p.num_rows = tokens;
  p.dst = ddst.as<uint16_t>();
  p.dst_blocks = dst_blocks;
  p.dst_tables = ddst_tables.as<int32_t>();
  p.table_width = table_width;
  DEEPINFER_CUDA_OK(kernels::GatherFp8LatentCacheBf16(p, nullptr));
  DEEPINFER_CUDA_OK(cudaDeviceSynchronize());

  std::vector<uint16_t> dst(static_cast<size_t>(dst_blocks) * kBlock * dim);
  std::vector<int32_t> dst_tables(static_cast<size_t>(tokens) * table_width);
  std::vector<int32_t> seq_out(tokens);
  DEEPINFER_CUDA_OK(cudaMemcpy(dst.data(), ddst.p, dst.size() * 2, cudaMemcpyDeviceToHost));
  DEEPINFER_CUDA_OK(
      cudaMemcpy(dst_tables.data(), ddst_tables.p, dst_tables.size() * 4, cudaMemcpyDeviceToHost));
  DEEPINFER_CUDA_OK(
      cudaMemcpy(seq_out.data(), dseq_out.p, tokens * sizeof(int32_t), cudaMemcpyDeviceToHost));
  std::vector<kernels::Fp8GatherRow> rows;
  for (int32_t t = 0; t < tokens; ++t) {
    rows.push_back({token_seq[t], context_len[t], t * table_width});
    EXPECT_EQ(seq_out[t], t);
  }
  ExpectCopy(s, rows, dst_tables, table_width, dst, dst_blocks);
}

INSTANTIATE_TEST_SUITE_P(Shapes, MlaFp8GatherTest,
                         ::testing::Values(std::make_pair(512, 64), std::make_pair(36, 6)));

}  // namespace
}  // namespace deepinfer
