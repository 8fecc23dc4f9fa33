//! What the pager knows of one tensor ([`Entry`]): its host range, its GPU buffer if resident,
//! whether that copy is newer (dirty), what the host bytes hold, pins, the plan's key, and why its
//! values are gone where they are.

use super::host::HostRange;
use super::plan::Key;
use super::slabs::Region;
use crate::error::{Error, Result};
use crate::tensor::DType;

/// What the host holds for a tensor that is not dirty on the GPU.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Contents {
    /// Never written: any bytes will do.
    Undefined,
    /// Logically zero: cleared on the GPU when placed there, never uploaded.
    Zero,
    /// The host bytes are the values.
    Host,
}

pub(super) struct Entry {
    pub(super) name: String,
    pub(super) bytes: u64,
    pub(super) host: HostRange,
    /// Where it is on the GPU, if resident.
    pub(super) gpu: Option<Region>,
    /// The GPU copy is newer than the host's.
    pub(super) dirty: bool,
    pub(super) contents: Contents,
    pub(super) key: Key,
    pub(super) last_use: u64,
    pub(super) uploads: u32,
    pub(super) pins: u32,
    /// A write-back of the only copy failed (the cause): the host bytes are stale, so every read
    /// is this error until the tensor is overwritten whole.
    pub(super) lost: Option<String>,
    /// Shape and element type, for telemetry (set by the context that made the tensor).
    pub(super) layout: Option<(Box<[usize]>, DType)>,
    /// Bytes written back since the host copy was last read (uploaded or read by the caller):
    /// counted as wasted if the tensor is freed first.
    pub(super) unread_writeback: u64,
    /// The caller has read its host copy (`read`, `sync_to_host`, ...): never dropped unwritten.
    pub(super) read_on_host: bool,
    /// `lost` because the plan dropped it unwritten (not a failure: `flush` does not report it).
    pub(super) lost_by_plan: bool,
    /// The caller will rewrite its host bytes before reading it (`Pager::expect_host_update`):
    /// not prefetched until they change.
    pub(super) host_update_due: bool,
    /// Its host bytes are lent to another thread (`Pager::lend_host`): no access until returned.
    pub(super) lent: bool,
    /// Once placed, it stays on the GPU (`Pager::keep_on_gpu`): never a victim of eviction.
    pub(super) kept: bool,
}

/// Why a dirty tensor was evicted without a write-back.
pub(super) const DROPPED_BY_PLAN: &str =
    "not written back: the previous step freed it without reading it again, and this \
     step had matched that one access for access; a read now means the steps differ (call `begin_step` at each \
     step, or set `PagerOptions::drop_dead_writebacks` to false)";

/// Why a tensor's values are gone without a failure: `Pager::discard`.
pub(super) const DISCARDED: &str =
    "discarded until its backward makes it again (`Pager::discard`): nothing may read it before that";

/// Why a tensor's values are gone without a failure: `Pager::forget`.
pub(super) const FORGOTTEN: &str =
    "forgotten until written whole again (`Pager::forget`: its values were used up): nothing may read it before that";

/// What happened to a tensor whose write-back could not be delivered.
pub(super) const LOST: &str = "its values are lost: reads fail until it is overwritten";
pub(super) const KEPT: &str = "its values stay on the GPU and its next write-back tries again";

impl Entry {
    /// Bytes moved per transfer (copies are whole 4-byte words).
    pub(super) fn copy_len(&self) -> u64 {
        self.bytes.max(4).div_ceil(4) * 4
    }

    /// The error every read of a lost tensor gets.
    pub(super) fn check_lost(&self) -> Result<()> {
        match &self.lost {
            Some(cause) => Err(Error::WriteBack { tensor: self.name.clone(), cause: cause.clone(), fate: LOST }),
            None => Ok(()),
        }
    }

    /// A delivery of this tensor's write-back failed with `err`: the GPU copy, if still there, is
    /// again the only one (dirty); otherwise the values are gone and the tensor is marked lost.
    pub(super) fn delivery_failed(&mut self, err: Error) -> Error {
        let cause = err.to_string();
        let fate = if self.gpu.is_some() {
            self.dirty = true;
            KEPT
        } else {
            self.lost = Some(cause.clone());
            LOST
        };
        Error::WriteBack { tensor: self.name.clone(), cause, fate }
    }
}
