// optim: fused optimizer updates and global grad-norm clipping.
//   adamw_update: AdamW with decoupled weight decay and bias correction, PER_THREAD_FEW
//                 parameters a thread (kernels::grid_strided_by).
//                 param (n)  m (n)  v (n)  grad (n)  clip (2): clip[0] multiplies the gradient
//                 g = grad * clip[0] * grad_scale;  m = b1 m + (1-b1) g;  v = b2 v + (1-b2) g^2
//                 param -= lr * (m/bc1 / (sqrt(v/bc2) + eps) + wd * param)
//   adamw_update_half: the same, also writing the new param into its f16 copy   half (n) f16 (B5)
//   sgd_update:   SGD with momentum (PyTorch's form): g = grad*clip[0]*grad_scale + wd*param;
//                 buf = momentum*buf + g;  param -= lr * buf.      param (n)  buf (n)  grad (n)  clip (2)
//   clip_scale:   clip[1] = grad_scale * sqrt(sum(sumsq)); clip[0] = min(1, max_norm / (clip[1] + 1e-6)), or 1 when
//                 max_norm <= 0.   clip (2)  sumsq (count)   one workgroup.
// Grids: 256 threads per workgroup, 2-D folded. CPU references: tests/common/reference.rs `adamw_update`,
// `sgd_update`.

// adamw: 0 param, 1 m, 2 v, 3 grad, 4 clip, 5 params
@group(0) @binding(0) var<storage, read_write> param: array<f32>;
@group(0) @binding(1) var<storage, read_write> m: array<f32>;
@group(0) @binding(2) var<storage, read_write> v: array<f32>;
@group(0) @binding(3) var<storage, read> grad: array<f32>;
@group(0) @binding(4) var<storage, read> clip: array<f32>;
// Params: optim::Params in src/kernels/optim.rs (gpu_params!: the WGSL struct is made from it)
@group(0) @binding(5) var<uniform> p: Params;

// adamw_update_half: 0-4 as adamw, 5 half, 6 params
@group(0) @binding(5) var<storage, read_write> half_copy: array<B5>;
@group(0) @binding(6) var<uniform> ph: Params;

// sgd: 0 param, 1 buf (`m`), 2 grad (`g2`), 3 clip (`clip3`), 4 params
@group(0) @binding(2) var<storage, read> g2: array<f32>;
@group(0) @binding(3) var<storage, read> clip3: array<f32>;
@group(0) @binding(4) var<uniform> ps: Params;

// clip_scale: 0 clip (`param`), 1 sumsq, 2 params
@group(0) @binding(1) var<storage, read> sumsq: array<f32>;
@group(0) @binding(2) var<uniform> pc: Params;

// Updates the PER_THREAD_FEW elements of param, m and v this thread takes (common.wgsl `strided_by`),
// every load first; returns their new param values (those at or past n unset).
fn adamw_strided(wid: vec3<u32>, nwg: vec3<u32>, lid: u32, prm: Params) -> array<f32, PER_THREAD_FEW> {
    var gs: array<f32, PER_THREAD_FEW>;
    var ms: array<f32, PER_THREAD_FEW>;
    var vs: array<f32, PER_THREAD_FEW>;
    var xs: array<f32, PER_THREAD_FEW>;
    for (var k = 0u; k < PER_THREAD_FEW; k++) {
        let i = strided_by(wid, nwg, lid, k, PER_THREAD_FEW);
        if (i < prm.n) {
            gs[k] = grad[i];
            ms[k] = m[i];
            vs[k] = v[i];
            xs[k] = param[i];
        }
    }
    let scale = clip[0] * prm.grad_scale;
    for (var k = 0u; k < PER_THREAD_FEW; k++) {
        let i = strided_by(wid, nwg, lid, k, PER_THREAD_FEW);
        if (i < prm.n) {
            let g = gs[k] * scale;
            let mi = prm.beta1 * ms[k] + (1.0 - prm.beta1) * g;
            let vi = prm.beta2 * vs[k] + (1.0 - prm.beta2) * g * g;
            m[i] = mi;
            v[i] = vi;
            let update = (mi / prm.bc1) / (sqrt(vi / prm.bc2) + prm.eps);
            xs[k] = xs[k] - prm.lr * (update + prm.weight_decay * xs[k]);
            param[i] = xs[k];
        }
    }
    return xs;
}

@compute @workgroup_size(256)
fn adamw_update(@builtin(local_invocation_index) lid: u32, @builtin(workgroup_id) wid: vec3<u32>,
                @builtin(num_workgroups) nwg: vec3<u32>) {
    adamw_strided(wid, nwg, lid, p);
}

@compute @workgroup_size(256)
fn adamw_update_half(@builtin(local_invocation_index) lid: u32, @builtin(workgroup_id) wid: vec3<u32>,
                     @builtin(num_workgroups) nwg: vec3<u32>) {
    let xs = adamw_strided(wid, nwg, lid, ph);
    for (var k = 0u; k < PER_THREAD_FEW; k++) {
        let i = strided_by(wid, nwg, lid, k, PER_THREAD_FEW);
        if (i < ph.n) {
            half_copy[i] = B5(xs[k]);
        }
    }
}

@compute @workgroup_size(256)
fn sgd_update(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let i = gid.x + gid.y * nwg.x * 256u;
    if (i >= ps.n) {
        return;
    }
    let g = g2[i] * clip3[0] * ps.grad_scale + ps.weight_decay * param[i];
    let b = ps.momentum * m[i] + g;
    m[i] = b;
    param[i] -= ps.lr * b;
}

@compute @workgroup_size(256)
fn clip_scale(@builtin(local_invocation_id) lid3: vec3<u32>) {
    let lid = lid3.x;
    var s = 0.0;
    for (var i = lid; i < pc.n; i += 256u) {
        s += sumsq[i];
    }
    let total = block_sum(s, lid);
    if (lid == 0u) {
        // the norm of the gradients as the update sees them (after grad_scale, e.g. 1/loss scale)
        let norm = sqrt(total) * pc.grad_scale;
        param[1] = norm;
        if (pc.max_norm > 0.0) {
            param[0] = min(1.0, pc.max_norm / (norm + 1e-6));
        } else {
            param[0] = 1.0;
        }
    }
}
