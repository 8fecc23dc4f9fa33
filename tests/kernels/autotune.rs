//! `pagetrain tune`: every candidate timed, the fastest kept, the kept file applied to the
//! kernels picked, and files that are not ours refused with the reason.

use super::ctx;
use pagetrain::bench::autotune::{autotune, Effort, HEAD_SIZES};
use pagetrain::kernels::attention::{self, Kernel};
use pagetrain::kernels::tuned::{AttentionChoice, AttentionKind, MatmulFamily, Tuned};
use pagetrain::kernels::MatmulVariant;

fn temp_file(name: &str) -> std::path::PathBuf {
    let dir = std::env::temp_dir().join(format!("pagetrain-tune-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    dir.join(name)
}

#[test]
fn the_tune_times_every_candidate_and_keeps_the_fastest_of_each_choice() {
    let ctx = ctx();
    let tuned = autotune(&ctx, Effort { iters: 1, repeats: 1 }).unwrap();
    let times = |choice: &str| -> Vec<(String, f64)> {
        tuned.measured.iter().filter(|m| m.choice == choice).map(|m| (m.candidate.clone(), m.ms)).collect()
    };
    let fastest = |choice: &str| {
        let t = times(choice);
        assert!(t.iter().all(|(_, ms)| ms.is_finite() && *ms > 0.0), "{choice}: {t:?}");
        t.into_iter().min_by(|a, b| a.1.total_cmp(&b.1)).expect("a candidate").0
    };
    let families: Vec<String> = MatmulFamily::ALL
        .into_iter()
        .filter(|f| f.runs_on(&ctx.gpu))
        .map(|f| format!("{f:?}").to_lowercase())
        .collect();
    assert_eq!(times("matmul").into_iter().map(|t| t.0).collect::<Vec<_>>(), families);
    assert_eq!(format!("{:?}", tuned.tuned.matmul).to_lowercase(), fastest("matmul"));
    assert_eq!(tuned.tuned.attention.len(), HEAD_SIZES.len());
    for (choice, d) in tuned.tuned.attention.iter().zip(HEAD_SIZES) {
        assert_eq!(choice.head_size as usize, d);
        for (backward, kind) in [(false, choice.forward), (true, choice.backward)] {
            let name = format!("attention {} d={d}", if backward { "backward" } else { "forward" });
            // every candidate that fits this adapter was timed, rows always
            let timed: Vec<String> = times(&name).into_iter().map(|t| t.0).collect();
            assert!(timed.contains(&"rows".to_string()), "{name}: {timed:?}");
            let limit = ctx.gpu.limits.max_compute_workgroup_storage_size as u64;
            let tiles: &[u32] = if backward { &[attention::BLOCKED_BACKWARD_TILE] } else { &attention::BLOCKED_TILES };
            let fits = |t: u32| attention::blocked_workgroup_bytes(d, t) <= limit;
            let want: Vec<String> = AttentionKind::candidates(&ctx.gpu, backward)
                .into_iter()
                .filter(|&c| match c {
                    AttentionKind::Blocked => tiles.iter().any(|&t| fits(t)),
                    AttentionKind::Blocked16 => fits(16),
                    _ => true,
                })
                .map(|c| format!("{c:?}").to_lowercase())
                .collect();
            assert_eq!(timed, want, "{name}");
            assert_eq!(format!("{kind:?}").to_lowercase(), fastest(&name), "{name}");
        }
    }
    // what is kept reads back the same
    let path = temp_file("roundtrip.toml");
    tuned.tuned.save(&path).unwrap();
    assert_eq!(Tuned::load(&path, &ctx.gpu).unwrap(), tuned.tuned);
}

#[test]
fn kept_choices_decide_the_kernels_unless_an_environment_variable_says_otherwise() {
    let mut ctx = ctx();
    let before = ctx.kernels.tuning;
    let lanes = if attention::lanes_supported(&ctx.gpu, 2) { AttentionKind::Lanes2 } else { AttentionKind::Rows };
    let attention = vec![
        AttentionChoice { head_size: 32, forward: AttentionKind::Rows, backward: lanes },
        AttentionChoice { head_size: 16, forward: AttentionKind::Blocked16, backward: AttentionKind::Rows },
        AttentionChoice { head_size: 24, forward: AttentionKind::Blocked, backward: AttentionKind::Rows },
    ];
    let tuned = Tuned::new(&ctx.gpu, MatmulFamily::Tiled, attention);
    ctx.kernels.tuning = tuned.apply(before, |_| false);
    assert_eq!(ctx.kernels.tuning.matmul, MatmulVariant::Tiled);
    let want_lanes = match lanes {
        AttentionKind::Lanes2 => Kernel::Lanes { lanes: 2 },
        _ => Kernel::Rows,
    };
    assert_eq!(attention::pick(&ctx.kernels, 32, false), Kernel::Rows);
    assert_eq!(attention::pick(&ctx.kernels, 32, true), want_lanes);
    assert_eq!(attention::pick(&ctx.kernels, 16, false), Kernel::Blocked { tile: 16 });
    assert_eq!(attention::pick(&ctx.kernels, 16, true), Kernel::Rows);
    let largest = attention::BLOCKED_TILES
        .into_iter()
        .find(|&t| {
            attention::blocked_workgroup_bytes(24, t) <= ctx.gpu.limits.max_compute_workgroup_storage_size as u64
        })
        .expect("a blocked tile fits head size 24");
    assert_eq!(attention::pick(&ctx.kernels, 24, false), Kernel::Blocked { tile: largest });
    // a head size not measured keeps the defaults
    ctx.kernels.tuning = before;
    let default_48 = (attention::pick(&ctx.kernels, 48, false), attention::pick(&ctx.kernels, 48, true));
    ctx.kernels.tuning = tuned.apply(before, |_| false);
    assert_eq!((attention::pick(&ctx.kernels, 48, false), attention::pick(&ctx.kernels, 48, true)), default_48);

    // built-in choices at sizes not measured stay (CPU adapters: 2 lanes at 64), measured ones replace them
    let applied = tuned.apply(before, |_| false);
    assert_eq!(applied.attention_for(64), before.attention_for(64));
    let at_64 = vec![AttentionChoice { head_size: 64, forward: AttentionKind::Rows, backward: AttentionKind::Rows }];
    let rows_64 = Tuned::new(&ctx.gpu, MatmulFamily::Direct, at_64).apply(before, |_| false).attention_for(64);
    assert_eq!((rows_64.blocked, rows_64.lanes), ((false, false), 1));

    // the environment wins: each variable over what it chooses, and only that
    let matmul_set = tuned.apply(before, |v| v == "PAGETRAIN_MATMUL");
    assert_eq!(matmul_set.matmul, before.matmul);
    assert_eq!(matmul_set.attention_for(32), tuned.apply(before, |_| false).attention_for(32));
    for var in ["PAGETRAIN_ATTENTION", "PAGETRAIN_ATTENTION_LANES"] {
        let attention_set = tuned.apply(before, |v| v == var);
        assert_eq!(attention_set.matmul, MatmulVariant::Tiled, "{var}");
        assert_eq!(attention_set.attention_tuned, before.attention_tuned, "{var}");
    }
}

#[test]
fn a_tuned_file_that_is_not_this_adapters_is_refused_with_the_reason() {
    let ctx = ctx();
    let good = Tuned::new(
        &ctx.gpu,
        MatmulFamily::Direct,
        vec![AttentionChoice { head_size: 64, forward: AttentionKind::Rows, backward: AttentionKind::Rows }],
    );
    let path = temp_file("good.toml");
    good.save(&path).unwrap();
    let text = std::fs::read_to_string(&path).unwrap();
    assert_eq!(Tuned::load(&path, &ctx.gpu).unwrap(), good);

    let other = format!("\"{}\"", good.adapter);
    let too_many: String = (0..5)
        .map(|i| format!("\n[[attention]]\nhead_size = {i}\nforward = \"rows\"\nbackward = \"rows\"\n"))
        .collect();
    let cases: Vec<(&str, Vec<u8>, &str)> = vec![
        ("garbage", vec![0xff, 0x00, 0x13, 0x37], "tuned kernel choices"),
        ("another adapter", text.replace(&other, "\"Some Other GPU\"").into_bytes(), "measured for adapter"),
        ("another version", text.replace("pagetrain = \"", "pagetrain = \"0.0.0-").into_bytes(), "pagetrain version"),
        ("an unknown kernel", text.replace("forward = \"rows\"", "forward = \"fastest\"").into_bytes(), "fastest"),
        ("an unknown field", format!("{text}\nextra = 1\n").into_bytes(), "extra"),
        ("too many head sizes", format!("{text}{too_many}").into_bytes(), "at most"),
        ("far too large", vec![b'#'; 64 << 10], "not a tuned file"),
        ("empty", Vec::new(), "tuned kernel choices"),
    ];
    for (what, bytes, says) in cases {
        let p = temp_file(&format!("{}.toml", what.replace(' ', "-")));
        std::fs::write(&p, bytes).unwrap();
        let err = Tuned::load(&p, &ctx.gpu).expect_err(what).to_string();
        assert!(err.contains(says), "{what}: `{err}` does not say `{says}`");
        assert!(err.contains(&p.display().to_string()), "{what}: `{err}` does not name the file");
    }
    let missing = temp_file("missing.toml");
    assert!(Tuned::load(&missing, &ctx.gpu).is_err());
}

#[test]
fn cpu_adapters_run_the_backward_on_two_lanes_a_row_at_head_size_64_and_not_at_32() {
    let mut ctx = ctx();
    let env_chooses =
        ["PAGETRAIN_ATTENTION", "PAGETRAIN_ATTENTION_LANES"].iter().any(|v| std::env::var_os(v).is_some());
    let cpu = ctx.gpu.info.device_type == wgpu::DeviceType::Cpu;
    let wide = cpu && !env_chooses && attention::lanes_supported(&ctx.gpu, 2);
    let picked =
        |ctx: &pagetrain::Context| (attention::pick(&ctx.kernels, 64, true), attention::pick(&ctx.kernels, 32, true));
    // (whatever a tuned file on this machine chose: the built-in table alone)
    ctx.kernels.tuning.attention_tuned = Default::default();
    let plain = picked(&ctx);
    ctx.kernels.tuning.attention_tuned = pagetrain::kernels::Tuning::builtin_heads(&ctx.gpu);
    let want_64 = if wide { Kernel::Lanes { lanes: 2 } } else { plain.0 };
    assert_eq!(picked(&ctx), (want_64, plain.1), "{}", ctx.gpu.describe());
}
