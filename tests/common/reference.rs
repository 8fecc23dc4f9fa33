//! CPU references in plain loops with f64 accumulation, named like the WGSL entry points they check.
#![allow(dead_code, clippy::too_many_arguments)]

/// C[b] = alpha·op(A[b])·op(B[b]) (+ bias): a is (batch,M,K) or (batch,K,M) when `ta`; b is
/// (batch,K,N) or (batch,N,K) when `tb` (batch stride 0 for a shared b: pass `b_shared`).
pub fn matmul_forward(
    a: &[f64],
    b: &[f64],
    bias: Option<&[f64]>,
    batch: usize,
    m: usize,
    n: usize,
    k: usize,
    ta: bool,
    tb: bool,
    b_shared: bool,
    alpha: f64,
) -> Vec<f64> {
    let mut c = vec![0.0; batch * m * n];
    for bt in 0..batch {
        let ao = bt * m * k;
        let bo = if b_shared { 0 } else { bt * k * n };
        for i in 0..m {
            for j in 0..n {
                let mut s = 0.0;
                for kk in 0..k {
                    let av = if ta { a[ao + kk * m + i] } else { a[ao + i * k + kk] };
                    let bv = if tb { b[bo + j * k + kk] } else { b[bo + kk * n + j] };
                    s += av * bv;
                }
                c[bt * m * n + i * n + j] = alpha * s + bias.map_or(0.0, |bb| bb[j]);
            }
        }
    }
    c
}

const GELU_SCALE: f64 = 0.7978845608028654;

pub fn gelu_forward(x: &[f64]) -> Vec<f64> {
    x.iter().map(|&v| 0.5 * v * (1.0 + (GELU_SCALE * (v + 0.044715 * v * v * v)).tanh())).collect()
}

pub fn gelu_backward(x: &[f64], dout: &[f64]) -> Vec<f64> {
    x.iter()
        .zip(dout)
        .map(|(&v, &d)| {
            let t = (GELU_SCALE * (v + 0.044715 * v * v * v)).tanh();
            d * (0.5 * (1.0 + t) + 0.5 * v * (1.0 - t * t) * GELU_SCALE * (1.0 + 3.0 * 0.044715 * v * v))
        })
        .collect()
}

pub fn relu_forward(x: &[f64]) -> Vec<f64> {
    x.iter().map(|&v| v.max(0.0)).collect()
}

pub fn relu_backward(x: &[f64], dout: &[f64]) -> Vec<f64> {
    x.iter().zip(dout).map(|(&v, &d)| if v > 0.0 { d } else { 0.0 }).collect()
}

/// (out, mean, rstd)
pub fn layernorm_forward(
    x: &[f64],
    w: &[f64],
    b: &[f64],
    rows: usize,
    c: usize,
    eps: f64,
) -> (Vec<f64>, Vec<f64>, Vec<f64>) {
    let mut out = vec![0.0; rows * c];
    let mut means = vec![0.0; rows];
    let mut rstds = vec![0.0; rows];
    for r in 0..rows {
        let row = &x[r * c..(r + 1) * c];
        let mean = row.iter().sum::<f64>() / c as f64;
        let var = row.iter().map(|v| (v - mean) * (v - mean)).sum::<f64>() / c as f64;
        let rstd = 1.0 / (var + eps).sqrt();
        for i in 0..c {
            out[r * c + i] = (row[i] - mean) * rstd * w[i] + b[i];
        }
        means[r] = mean;
        rstds[r] = rstd;
    }
    (out, means, rstds)
}

/// (dx, dw, db)
pub fn layernorm_backward(
    dout: &[f64],
    x: &[f64],
    w: &[f64],
    rows: usize,
    c: usize,
    eps: f64,
) -> (Vec<f64>, Vec<f64>, Vec<f64>) {
    let (_, means, rstds) = layernorm_forward(x, w, &vec![0.0; c], rows, c, eps);
    let mut dx = vec![0.0; rows * c];
    let mut dw = vec![0.0; c];
    let mut db = vec![0.0; c];
    for r in 0..rows {
        let (mean, rstd) = (means[r], rstds[r]);
        let norm: Vec<f64> = (0..c).map(|i| (x[r * c + i] - mean) * rstd).collect();
        let dn: Vec<f64> = (0..c).map(|i| dout[r * c + i] * w[i]).collect();
        let mean_dn = dn.iter().sum::<f64>() / c as f64;
        let mean_dn_n = dn.iter().zip(&norm).map(|(a, b)| a * b).sum::<f64>() / c as f64;
        for i in 0..c {
            dx[r * c + i] = rstd * (dn[i] - mean_dn - norm[i] * mean_dn_n);
            dw[i] += dout[r * c + i] * norm[i];
            db[i] += dout[r * c + i];
        }
    }
    (dx, dw, db)
}

pub fn softmax_forward(x: &[f64], rows: usize, len: usize, causal_t: usize, scale: f64) -> Vec<f64> {
    let mut y = vec![0.0; rows * len];
    for r in 0..rows {
        let valid = if causal_t == 0 { len } else { (r % causal_t + 1).min(len) };
        let row = &x[r * len..r * len + valid];
        let m = row.iter().map(|v| v * scale).fold(f64::NEG_INFINITY, f64::max);
        let s: f64 = row.iter().map(|v| (v * scale - m).exp()).sum();
        for j in 0..valid {
            y[r * len + j] = (row[j] * scale - m).exp() / s;
        }
    }
    y
}

pub fn softmax_backward(y: &[f64], dy: &[f64], rows: usize, len: usize, scale: f64) -> Vec<f64> {
    let mut dx = vec![0.0; rows * len];
    for r in 0..rows {
        let o = r * len;
        let dot: f64 = (0..len).map(|j| dy[o + j] * y[o + j]).sum();
        for j in 0..len {
            dx[o + j] = scale * y[o + j] * (dy[o + j] - dot);
        }
    }
    dx
}

/// Causal self-attention: qkv (B,T,3C) → (B,T,C).
pub fn attention_forward(qkv: &[f64], b: usize, t: usize, c: usize, h: usize) -> Vec<f64> {
    let d = c / h;
    let scale = 1.0 / (d as f64).sqrt();
    let mut out = vec![0.0; b * t * c];
    for bi in 0..b {
        for hi in 0..h {
            for i in 0..t {
                let q = |dd: usize| qkv[(bi * t + i) * 3 * c + hi * d + dd];
                let mut scores = vec![0.0; i + 1];
                for (j, s) in scores.iter_mut().enumerate() {
                    *s = (0..d).map(|dd| q(dd) * qkv[(bi * t + j) * 3 * c + c + hi * d + dd]).sum::<f64>() * scale;
                }
                let m = scores.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
                let z: f64 = scores.iter().map(|s| (s - m).exp()).sum();
                for dd in 0..d {
                    out[(bi * t + i) * c + hi * d + dd] = (0..=i)
                        .map(|j| (scores[j] - m).exp() / z * qkv[(bi * t + j) * 3 * c + 2 * c + hi * d + dd])
                        .sum();
                }
            }
        }
    }
    out
}

/// Gradient of Σ attention_forward(qkv)·dout with respect to qkv (B,T,3C): the textbook
/// backward through the (T,T) probabilities, checked against finite differences in gradcheck.
pub fn attention_backward(qkv: &[f64], dout: &[f64], b: usize, t: usize, c: usize, h: usize) -> Vec<f64> {
    let d = c / h;
    let scale = 1.0 / (d as f64).sqrt();
    let mut dqkv = vec![0.0; qkv.len()];
    let at = |bi: usize, j: usize, part: usize, hi: usize, dd: usize| (bi * t + j) * 3 * c + part * c + hi * d + dd;
    for bi in 0..b {
        for hi in 0..h {
            for i in 0..t {
                let s: Vec<f64> = (0..=i)
                    .map(|j| {
                        (0..d).map(|dd| qkv[at(bi, i, 0, hi, dd)] * qkv[at(bi, j, 1, hi, dd)]).sum::<f64>() * scale
                    })
                    .collect();
                let m = s.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
                let z: f64 = s.iter().map(|x| (x - m).exp()).sum();
                let p: Vec<f64> = s.iter().map(|x| (x - m).exp() / z).collect();
                let g = |dd: usize| dout[(bi * t + i) * c + hi * d + dd];
                // dp_j = dout_i · v_j; ds_j = p_j (dp_j − Σ_k p_k dp_k)
                let dp: Vec<f64> = (0..=i).map(|j| (0..d).map(|dd| g(dd) * qkv[at(bi, j, 2, hi, dd)]).sum()).collect();
                let mean: f64 = p.iter().zip(&dp).map(|(a, b)| a * b).sum();
                for j in 0..=i {
                    let ds = p[j] * (dp[j] - mean) * scale;
                    for dd in 0..d {
                        dqkv[at(bi, i, 0, hi, dd)] += ds * qkv[at(bi, j, 1, hi, dd)];
                        dqkv[at(bi, j, 1, hi, dd)] += ds * qkv[at(bi, i, 0, hi, dd)];
                        dqkv[at(bi, j, 2, hi, dd)] += p[j] * g(dd);
                    }
                }
            }
        }
    }
    dqkv
}

/// tokens (N), wte (V,C), wpe (maxT,C) → (N,C), row r at position r % t.
pub fn embedding_forward(tokens: &[u32], wte: &[f64], wpe: &[f64], t: usize, c: usize) -> Vec<f64> {
    let mut out = vec![0.0; tokens.len() * c];
    for (r, &tok) in tokens.iter().enumerate() {
        for i in 0..c {
            out[r * c + i] = wte[tok as usize * c + i] + wpe[(r % t) * c + i];
        }
    }
    out
}

/// (dwte, dwpe)
pub fn embedding_backward(
    tokens: &[u32],
    dout: &[f64],
    v: usize,
    max_t: usize,
    t: usize,
    c: usize,
) -> (Vec<f64>, Vec<f64>) {
    let mut dwte = vec![0.0; v * c];
    let mut dwpe = vec![0.0; max_t * c];
    for (r, &tok) in tokens.iter().enumerate() {
        for i in 0..c {
            dwte[tok as usize * c + i] += dout[r * c + i];
            dwpe[(r % t) * c + i] += dout[r * c + i];
        }
    }
    (dwte, dwpe)
}

/// log Σ exp of `row`, shifted by its maximum.
pub fn log_sum_exp(row: &[f64]) -> f64 {
    let m = row.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
    m + row.iter().map(|x| (x - m).exp()).sum::<f64>().ln()
}

/// Per-row losses (0 for ignored rows) and their mean over valid rows.
pub fn cross_entropy_forward(logits: &[f64], targets: &[u32], v: usize, ignore: u32) -> (Vec<f64>, f64) {
    let rows = targets.len();
    let mut losses = vec![0.0; rows];
    let mut count = 0;
    for r in 0..rows {
        if targets[r] == ignore {
            continue;
        }
        let row = &logits[r * v..(r + 1) * v];
        losses[r] = log_sum_exp(row) - row[targets[r] as usize];
        count += 1;
    }
    let mean = if count == 0 { 0.0 } else { losses.iter().sum::<f64>() / count as f64 };
    (losses, mean)
}

pub fn cross_entropy_backward(logits: &[f64], targets: &[u32], v: usize, ignore: u32, dloss: f64) -> Vec<f64> {
    let rows = targets.len();
    let count = targets.iter().filter(|&&t| t != ignore).count().max(1) as f64;
    let mut d = vec![0.0; rows * v];
    for r in 0..rows {
        if targets[r] == ignore {
            continue;
        }
        let row = &logits[r * v..(r + 1) * v];
        let m = row.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
        let z: f64 = row.iter().map(|x| (x - m).exp()).sum();
        for j in 0..v {
            let p = (row[j] - m).exp() / z;
            d[r * v + j] = dloss / count * (p - if j as u32 == targets[r] { 1.0 } else { 0.0 });
        }
    }
    d
}

pub fn sum_forward(x: &[f64], squares: bool) -> f64 {
    x.iter().map(|v| if squares { v * v } else { *v }).sum()
}

pub fn sum_rows(x: &[f64], rows: usize, cols: usize) -> Vec<f64> {
    (0..cols).map(|j| (0..rows).map(|r| x[r * cols + j]).sum()).collect()
}

/// One AdamW step; returns (param, m, v).
pub fn adamw_update(
    p: &[f64],
    g: &[f64],
    m: &[f64],
    v: &[f64],
    lr: f64,
    b1: f64,
    b2: f64,
    eps: f64,
    wd: f64,
    t: i32,
    clip: f64,
) -> (Vec<f64>, Vec<f64>, Vec<f64>) {
    let (bc1, bc2) = (1.0 - b1.powi(t), 1.0 - b2.powi(t));
    let mut out = (p.to_vec(), m.to_vec(), v.to_vec());
    for i in 0..p.len() {
        let gi = g[i] * clip;
        out.1[i] = b1 * m[i] + (1.0 - b1) * gi;
        out.2[i] = b2 * v[i] + (1.0 - b2) * gi * gi;
        let upd = (out.1[i] / bc1) / ((out.2[i] / bc2).sqrt() + eps);
        out.0[i] = p[i] - lr * (upd + wd * p[i]);
    }
    out
}

/// One SGD-with-momentum step; returns (param, buf).
pub fn sgd_update(
    p: &[f64],
    g: &[f64],
    buf: &[f64],
    lr: f64,
    momentum: f64,
    wd: f64,
    clip: f64,
) -> (Vec<f64>, Vec<f64>) {
    let mut out = (p.to_vec(), buf.to_vec());
    for i in 0..p.len() {
        let gi = g[i] * clip + wd * p[i];
        out.1[i] = momentum * buf[i] + gi;
        out.0[i] = p[i] - lr * out.1[i];
    }
    out
}

/// GPT-2 forward as Hugging Face's GPT2LMHeadModel computes it, from checkpoint tensors by their
/// Hugging Face names (Conv1D weights are (in, out)): tokens (B,T) → logits (B,T,V).
pub fn gpt2_forward(
    w: &dyn Fn(&str) -> Vec<f64>,
    n_layer: usize,
    n_head: usize,
    c: usize,
    v: usize,
    tokens: &[u32],
    b: usize,
    t: usize,
) -> Vec<f64> {
    let n = b * t;
    let mut x = embedding_forward(tokens, &w("transformer.wte.weight"), &w("transformer.wpe.weight"), t, c);
    for l in 0..n_layer {
        let p = |s: &str| w(&format!("transformer.h.{l}.{s}"));
        let h = layernorm_forward(&x, &p("ln_1.weight"), &p("ln_1.bias"), n, c, 1e-5).0;
        let qkv = matmul_forward(
            &h,
            &p("attn.c_attn.weight"),
            Some(&p("attn.c_attn.bias")),
            1,
            n,
            3 * c,
            c,
            false,
            false,
            true,
            1.0,
        );
        let y = attention_forward(&qkv, b, t, c, n_head);
        let a = matmul_forward(
            &y,
            &p("attn.c_proj.weight"),
            Some(&p("attn.c_proj.bias")),
            1,
            n,
            c,
            c,
            false,
            false,
            true,
            1.0,
        );
        x.iter_mut().zip(&a).for_each(|(xi, ai)| *xi += ai);
        let h = layernorm_forward(&x, &p("ln_2.weight"), &p("ln_2.bias"), n, c, 1e-5).0;
        let f = gelu_forward(&matmul_forward(
            &h,
            &p("mlp.c_fc.weight"),
            Some(&p("mlp.c_fc.bias")),
            1,
            n,
            4 * c,
            c,
            false,
            false,
            true,
            1.0,
        ));
        let m = matmul_forward(
            &f,
            &p("mlp.c_proj.weight"),
            Some(&p("mlp.c_proj.bias")),
            1,
            n,
            c,
            4 * c,
            false,
            false,
            true,
            1.0,
        );
        x.iter_mut().zip(&m).for_each(|(xi, mi)| *xi += mi);
    }
    let h = layernorm_forward(&x, &w("transformer.ln_f.weight"), &w("transformer.ln_f.bias"), n, c, 1e-5).0;
    matmul_forward(&h, &w("transformer.wte.weight"), None, 1, n, v, c, false, true, true, 1.0)
}
