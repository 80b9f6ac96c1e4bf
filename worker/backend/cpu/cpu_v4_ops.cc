// CpuV4Ops: reference fp32 implementations, written to follow HF transformers' deepseek_v4
// arithmetic step by step (the order of each sum as documented in v4_ops.h).
#include "worker/backend/cpu/cpu_v4_ops.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <utility>
#include <vector>

namespace deepinfer {
namespace {

float Sigmoid(float x) { return 1.0f / (1.0f + std::exp(-x)); }

// sum_j weights[j] * streams[j] over hc streams of width hidden.
void Collapse(int64_t hc, int64_t hidden, const float* weights, const float* streams, float* out) {
  for (int64_t d = 0; d < hidden; ++d) {
    float acc = 0.0f;
    for (int64_t j = 0; j < hc; ++j) acc += weights[j] * streams[j * hidden + d];
    out[d] = acc;
  }
}

// Row i of the stream of block-table row `seq`: a pointer into the stream where the row lies in
// one block, else the row gathered into tmp (dim floats).
const float* PagedRow(const V4PagedRows& s, int64_t dim, int64_t seq, int64_t i, float* tmp) {
  const int32_t* table = s.block_tables + seq * s.table_stride;
  const int64_t P = s.block_floats, first = i * dim;
  if (first / P == (first + dim - 1) / P) {
    return s.data + int64_t{table[first / P]} * P + first % P;
  }
  for (int64_t d = 0; d < dim;) {
    const int64_t e = first + d, run = std::min(dim - d, P - e % P);
    std::copy_n(s.data + int64_t{table[e / P]} * P + e % P, run, tmp + d);
    d += run;
  }
  return tmp;
}

}  // namespace

void CpuV4Ops::HcMix(const HcMixArgs& a) {
  const int64_t hc = a.hc, mix = (2 + hc) * hc;
  pool_->ParallelFor(a.rows, 1, [&](int64_t b, int64_t e) {
    std::vector<float> pre(hc), comb(hc * hc);
    for (int64_t r = b; r < e; ++r) {
      const float* m = a.mixes + r * mix;
      for (int64_t j = 0; j < hc; ++j) {
        pre[j] = Sigmoid(m[j] * a.scale[0] + a.base[j]) + a.eps;
        a.post[r * hc + j] = 2.0f * Sigmoid(m[hc + j] * a.scale[1] + a.base[hc + j]);
      }
      // Row softmax of the comb logits, + eps.
      for (int64_t j = 0; j < hc; ++j) {
        float* row = comb.data() + j * hc;
        float mx = -std::numeric_limits<float>::infinity();
        for (int64_t k = 0; k < hc; ++k) {
          row[k] = m[2 * hc + j * hc + k] * a.scale[2] + a.base[2 * hc + j * hc + k];
          mx = std::max(mx, row[k]);
        }
        float sum = 0.0f;
        for (int64_t k = 0; k < hc; ++k) {
          row[k] = std::exp(row[k] - mx);
          sum += row[k];
        }
        for (int64_t k = 0; k < hc; ++k) row[k] = row[k] / sum + a.eps;
      }
      auto normalize_columns = [&] {
        for (int64_t k = 0; k < hc; ++k) {
          float s = 0.0f;
          for (int64_t j = 0; j < hc; ++j) s += comb[j * hc + k];
          for (int64_t j = 0; j < hc; ++j) comb[j * hc + k] /= s + a.eps;
        }
      };
      auto normalize_rows = [&] {
        for (int64_t j = 0; j < hc; ++j) {
          float s = 0.0f;
          for (int64_t k = 0; k < hc; ++k) s += comb[j * hc + k];
          for (int64_t k = 0; k < hc; ++k) comb[j * hc + k] /= s + a.eps;
        }
      };
      normalize_columns();
      for (int32_t it = 1; it < a.sinkhorn_iters; ++it) {
        normalize_rows();
        normalize_columns();
      }
      std::copy(comb.begin(), comb.end(), a.comb + r * hc * hc);
      Collapse(hc, a.hidden, pre.data(), a.streams + r * hc * a.hidden, a.collapsed + r * a.hidden);
    }
  });
}

void CpuV4Ops::HcHead(const HcHeadArgs& a) {
  pool_->ParallelFor(a.rows, 1, [&](int64_t b, int64_t e) {
    std::vector<float> pre(a.hc);
    for (int64_t r = b; r < e; ++r) {
      for (int64_t j = 0; j < a.hc; ++j) {
        pre[j] = Sigmoid(a.mixes[r * a.hc + j] * a.scale[0] + a.base[j]) + a.eps;
      }
      Collapse(a.hc, a.hidden, pre.data(), a.streams + r * a.hc * a.hidden, a.out + r * a.hidden);
    }
  });
}

void CpuV4Ops::HcExpand(const HcExpandArgs& a) {
  const int64_t hc = a.hc, H = a.hidden;
  pool_->ParallelFor(a.rows, 1, [&](int64_t b, int64_t e) {
    for (int64_t r = b; r < e; ++r) {
      const float* in = a.streams_in + r * hc * H;
      const float* comb = a.comb + r * hc * hc;
      const float* f = a.block_out + r * H;
      for (int64_t k = 0; k < hc; ++k) {
        const float post = a.post[r * hc + k];
        float* out = a.streams_out + (r * hc + k) * H;
        for (int64_t d = 0; d < H; ++d) {
          float mixed = 0.0f;
          for (int64_t j = 0; j < hc; ++j) mixed += comb[j * hc + k] * in[j * H + d];
          out[d] = post * f[d] + mixed;
        }
      }
    }
  });
}

void CpuV4Ops::CompressWindows(const CompressWindowsArgs& a) {
  const int64_t R = a.ratio, D = a.dim;
  const int64_t slots = a.overlap ? 2 * R : R;
  const int64_t width = a.overlap ? 2 * D : D;
  const int64_t stride = a.row_stride > 0 ? a.row_stride : width;
  pool_->ParallelFor(a.windows, 1, [&](int64_t b, int64_t e) {
    std::vector<float> g(slots), v(slots);
    for (int64_t w = b; w < e; ++w) {
      const float* kv = a.kv + w * slots * stride;
      const float* gate = a.gate + w * slots * stride;
      const bool prev = a.overlap && a.has_prev[w] != 0;
      for (int64_t d = 0; d < D; ++d) {
        for (int64_t s = 0; s < slots; ++s) {
          if (!a.overlap) {
            v[s] = kv[s * stride + d];
            g[s] = gate[s * stride + d] + a.bias[s * width + d];
          } else if (s < R) {  // the previous window's first half
            v[s] = prev ? kv[s * stride + d] : 0.0f;
            g[s] = prev ? gate[s * stride + d] + a.bias[s * width + d]
                        : -std::numeric_limits<float>::infinity();
          } else {  // this window's second half
            v[s] = kv[s * stride + D + d];
            g[s] = gate[s * stride + D + d] + a.bias[(s - R) * width + D + d];
          }
        }
        float mx = -std::numeric_limits<float>::infinity();
        for (int64_t s = 0; s < slots; ++s) mx = std::max(mx, g[s]);
        float sum = 0.0f;
        for (int64_t s = 0; s < slots; ++s) {
          g[s] = std::exp(g[s] - mx);
          sum += g[s];
        }
        float acc = 0.0f;
        for (int64_t s = 0; s < slots; ++s) acc += v[s] * (g[s] / sum);
        a.out[w * D + d] = acc;
      }
    }
  });
}

void CpuV4Ops::SinkAttention(const SinkAttentionArgs& a) {
  const int64_t D = a.dim;
  pool_->ParallelFor(a.tokens * a.heads, 1, [&](int64_t b, int64_t e) {
    std::vector<const float*> window;
    std::vector<int64_t> extra;  // stream rows
    std::vector<float> logits, tmp(D);
    for (int64_t th = b; th < e; ++th) {
      const int64_t t = th / a.heads, h = th % a.heads;
      window.clear();
      extra.clear();
      const int64_t pos = a.positions[t];
      for (int64_t p = pos - a.window_len[t] + 1; p <= pos; ++p) {
        window.push_back(p >= a.step_start[t]
                             ? a.kv + (t - (pos - p)) * D
                             : a.ring + a.ring_slot[t] * a.ring_stride + (p % a.ring_rows) * D);
      }
      if (a.entries.data != nullptr && a.selected != nullptr) {
        const int32_t* sel = a.selected + t * a.selected_stride;
        for (int64_t i = 0; i < a.selected_stride && sel[i] >= 0; ++i) extra.push_back(sel[i]);
      } else if (a.entries.data != nullptr && a.extra_len != nullptr) {
        for (int32_t i = 0; i < a.extra_len[t]; ++i) extra.push_back(i);
      }
      const int64_t seq = a.entries.data != nullptr ? a.entries.token_seq[t] : 0;
      auto row = [&](size_t r) {
        return r < window.size()
                   ? window[r]
                   : PagedRow(a.entries, D, seq, extra[r - window.size()], tmp.data());
      };
      const size_t rows = window.size() + extra.size();
      const float* q = a.q + th * D;
      logits.resize(rows);
      float mx = a.sinks[h];
      for (size_t r = 0; r < rows; ++r) {
        const float* k = row(r);
        float dot = 0.0f;
        for (int64_t d = 0; d < D; ++d) dot += q[d] * k[d];
        logits[r] = dot * a.scale;
        mx = std::max(mx, logits[r]);
      }
      float sum = std::exp(a.sinks[h] - mx);
      for (float& l : logits) {
        l = std::exp(l - mx);
        sum += l;
      }
      float* out = a.out + th * D;
      std::fill(out, out + D, 0.0f);
      for (size_t r = 0; r < rows; ++r) {
        const float p = logits[r] / sum;
        const float* v = row(r);
        for (int64_t d = 0; d < D; ++d) out[d] += p * v[d];
      }
    }
  });
}

void CpuV4Ops::IndexerTopK(const IndexerTopKArgs& a) {
  const int64_t D = a.dim, NH = a.heads;
  pool_->ParallelFor(a.tokens, 1, [&](int64_t b, int64_t e) {
    using Elem = std::pair<double, int64_t>;  // torch's queue: (accumulate-type value, index)
    std::vector<Elem> queue;
    std::vector<int32_t> chosen;
    std::vector<float> tmp(D);
    for (int64_t t = b; t < e; ++t) {
      const int32_t n = a.candidates[t];
      queue.resize(n);
      for (int32_t i = 0; i < n; ++i) {
        float s = -std::numeric_limits<float>::infinity();
        if (i < a.visible[t]) {
          const float* k = PagedRow(a.keys, D, a.keys.token_seq[t], i, tmp.data());
          s = 0.0f;
          for (int64_t h = 0; h < NH; ++h) {
            const float* q = a.q + (t * NH + h) * D;
            float dot = 0.0f;
            for (int64_t d = 0; d < D; ++d) dot += q[d] * k[d];
            const float w = a.weights[t * NH + h] * a.weight_scale;
            s += std::max(dot, 0.0f) * a.key_scale * w;
          }
        }
        queue[i] = {static_cast<double>(s), i};
      }
      const int64_t k = std::min<int64_t>(a.topk, n);
      auto larger = [](const Elem& x, const Elem& y) {
        return (std::isnan(x.first) && !std::isnan(y.first)) || x.first > y.first;
      };
      if (k > 0 && k * 64 <= n) {
        std::partial_sort(queue.begin(), queue.begin() + k, queue.end(), larger);
      } else if (k > 0) {
        std::nth_element(queue.begin(), queue.begin() + k - 1, queue.end(), larger);
        std::sort(queue.begin(), queue.begin() + k - 1, larger);
      }
      chosen.clear();
      for (int64_t i = 0; i < k; ++i) {
        if (queue[i].second < a.visible[t]) chosen.push_back(static_cast<int32_t>(queue[i].second));
      }
      std::sort(chosen.begin(), chosen.end());
      int32_t* sel = a.selected + t * a.topk;
      for (int64_t i = 0; i < a.topk; ++i) {
        sel[i] = i < static_cast<int64_t>(chosen.size()) ? chosen[i] : -1;
      }
    }
  });
}

void CpuV4Ops::Route(const V4RouteArgs& a) {
  const int64_t E = a.experts, K = a.top_k;
  pool_->ParallelFor(a.rows, 1, [&](int64_t b, int64_t e) {
    std::vector<float> scores(E), sel(E);
    std::vector<int32_t> order(E);
    std::vector<std::pair<int32_t, float>> picked(K);
    for (int64_t r = b; r < e; ++r) {
      const float* l = a.logits + r * E;
      for (int64_t x = 0; x < E; ++x) {
        if (a.sqrtsoftplus) {
          const float sp = l[x] > 20.0f ? l[x] : std::log1p(std::exp(l[x]));
          scores[x] = std::sqrt(sp);
        } else {
          scores[x] = 1.0f / (1.0f + std::exp(-l[x]));
        }
        sel[x] = a.bias != nullptr ? scores[x] + a.bias[x] : scores[x];
      }
      std::vector<int32_t> ids(K);
      if (a.hash_table != nullptr) {
        const int32_t* row = a.hash_table + static_cast<int64_t>(a.token_ids[r]) * K;
        for (int64_t k = 0; k < K; ++k) ids[k] = row[k];
      } else {
        std::iota(order.begin(), order.end(), 0);
        std::partial_sort(order.begin(), order.begin() + K, order.end(), [&](int32_t x, int32_t y) {
          return sel[x] > sel[y] || (sel[x] == sel[y] && x < y);
        });
        for (int64_t k = 0; k < K; ++k) ids[k] = order[k];
      }
      float sum = 0.0f;
      for (int64_t k = 0; k < K; ++k) sum += scores[ids[k]];
      for (int64_t k = 0; k < K; ++k) {
        picked[k] = {ids[k], scores[ids[k]] / (sum + 1e-20f) * a.scaling};
      }
      std::stable_sort(picked.begin(), picked.end(),
                       [](const auto& x, const auto& y) { return x.first < y.first; });
      for (int64_t k = 0; k < K; ++k) {
        a.topk_ids[r * K + k] = picked[k].first;
        a.topk_weights[r * K + k] = picked[k].second;
      }
    }
  });
}

void CpuV4Ops::CopyRows(const CopyRowsArgs& a) {
  pool_->ParallelFor(a.rows, 64, [&](int64_t b, int64_t e) {
    for (int64_t r = b; r < e; ++r) {
      const int64_t dst = a.dst_offsets != nullptr ? a.dst_offsets[r] : r * a.width;
      if (dst < 0) continue;
      const int64_t src = a.src_offsets != nullptr ? a.src_offsets[r] : r * a.width;
      std::copy(a.src + src, a.src + src + a.width, a.dst + dst);
    }
  });
}

void CpuV4Ops::SwiGluClamped(int64_t rows, int64_t inter, const float* x, float limit, float* out) {
  pool_->ParallelFor(rows, 1, [&](int64_t b, int64_t e) {
    for (int64_t r = b; r < e; ++r) {
      const float* g = x + r * 2 * inter;
      const float* u = g + inter;
      float* o = out + r * inter;
      for (int64_t i = 0; i < inter; ++i) {
        float gate = g[i], up = u[i];
        if (limit > 0.0f) {
          gate = std::min(gate, limit);
          up = std::clamp(up, -limit, limit);
        }
        o[i] = gate / (1.0f + std::exp(-gate)) * up;
      }
    }
  });
}

}  // namespace deepinfer
