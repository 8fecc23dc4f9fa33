// transpose: out (cols, rows) = in (rows, cols) transposed, row-major both; f32 or f16 either side
// (B0 out, B1 in; converted through f32); out's rows are out_stride >= rows long, the padding
// written with zeros. What lets a product read an operand transposed by reading a transposed copy
// instead: `matmul_coop` multiplies NN faster than NT.
// A workgroup of 32x8 threads moves a 32x32 tile through workgroup memory (rows padded by one:
// the column reads fall in distinct banks), so reads and writes are both along rows.
// Dispatch (ceil(cols/32), ceil(out_stride/32), 1). CPU reference: tests/kernels/matmul.rs.

@group(0) @binding(0) var<storage, read_write> out: array<B0>;
@group(0) @binding(1) var<storage, read> src: array<B1>;
// Params: transpose::Params in src/kernels/transpose.rs (gpu_params!: the WGSL struct is made from it)
@group(0) @binding(2) var<uniform> p: Params;

const TILE: u32 = 32u;
var<workgroup> tile: array<array<f32, 33>, 32>;

@compute @workgroup_size(32, 8)
fn transpose(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_id) lid: vec3<u32>) {
    let col0 = wg.x * TILE;
    let row0 = wg.y * TILE;
    for (var i = 0u; i < TILE; i += 8u) {
        let r = row0 + lid.y + i;
        let c = col0 + lid.x;
        if (c < p.cols) {
            tile[lid.y + i][lid.x] = select(0.0, f32(src[min(r, p.rows - 1u) * p.cols + c]), r < p.rows);
        }
    }
    workgroupBarrier();
    // out row = an input column, out column = an input row
    for (var i = 0u; i < TILE; i += 8u) {
        let oc = row0 + lid.x;
        let or = col0 + lid.y + i;
        if (or < p.cols && oc < p.out_stride) {
            out[or * p.out_stride + oc] = B0(tile[lid.x][lid.y + i]);
        }
    }
}
