//! `pagetrain info`: the adapters wgpu sees and the one chosen.

use pagetrain::Error;

pub(crate) async fn info() -> Result<(), Error> {
    let adapters = pagetrain::device::list_adapters().await;
    println!("adapters wgpu sees:");
    for a in &adapters {
        println!(
            "  {} ({:?}, {:?}) driver: {}{}",
            a.name,
            a.backend,
            a.device_type,
            a.driver,
            if a.compute { "" } else { "  [no compute: unusable]" }
        );
    }
    let gpu = pagetrain::device::Gpu::new(&Default::default()).await?;
    let l = &gpu.limits;
    println!("chosen: {}", gpu.describe());
    println!("  max buffer size:            {} bytes", l.max_buffer_size);
    println!("  max storage binding:        {} bytes", l.max_storage_buffer_binding_size);
    println!("  max storage buffers/stage:  {}", l.max_storage_buffers_per_shader_stage);
    println!("  max workgroup storage:      {} bytes", l.max_compute_workgroup_storage_size);
    println!("  max invocations/workgroup:  {}", l.max_compute_invocations_per_workgroup);
    println!("  max workgroups/dimension:   {}", l.max_compute_workgroups_per_dimension);
    println!("  storage offset alignment:   {}", l.min_storage_buffer_offset_alignment);
    let f = gpu.features;
    println!(
        "  features: shader-f16 {}, subgroups {}, timestamp queries {}",
        f.contains(wgpu::Features::SHADER_F16),
        f.contains(wgpu::Features::SUBGROUP),
        f.contains(wgpu::Features::TIMESTAMP_QUERY)
    );
    println!(
        "  shader runtime checks: {}",
        if gpu.shader_checks { "on" } else { "off (PAGETRAIN_SHADER_CHECKS=1 turns them on)" }
    );
    Ok(())
}
