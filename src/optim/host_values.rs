//! Host bytes of the pager's store seen as values: in place where aligned, else through a copy
//! written back when done (the host and sharded optimizers' passes).

use std::borrow::Cow;

/// The values of host bytes (copied when the bytes are not aligned for `T`).
pub(super) fn pods<T: bytemuck::Pod>(bytes: &[u8]) -> Cow<'_, [T]> {
    match bytemuck::try_cast_slice(bytes) {
        Ok(v) => Cow::Borrowed(v),
        Err(_) => Cow::Owned(bytemuck::pod_collect_to_vec(bytes)),
    }
}

/// Host bytes seen as values of `T` to change: in place when aligned (the store aligns every
/// tensor to 256 bytes), else through a copy that [`PodsMut::finish`] writes back (the host and
/// the sharded optimizers' values, moments and f16 copies).
pub(crate) enum PodsMut<'a, T: bytemuck::Pod> {
    InPlace(&'a mut [T]),
    Copied(Vec<T>, &'a mut [u8]),
}

/// Host bytes seen as f32 to change (see [`PodsMut`]).
pub(crate) type F32sMut<'a> = PodsMut<'a, f32>;

impl<'a, T: bytemuck::Pod> PodsMut<'a, T> {
    pub(crate) fn new(bytes: &'a mut [u8]) -> Self {
        let size = std::mem::size_of::<T>();
        if bytes.as_ptr().align_offset(std::mem::align_of::<T>()) == 0 && bytes.len().is_multiple_of(size) {
            PodsMut::InPlace(bytemuck::cast_slice_mut(bytes))
        } else {
            PodsMut::Copied(bytemuck::pod_collect_to_vec(bytes), bytes)
        }
    }

    pub(crate) fn values(&mut self) -> &mut [T] {
        match self {
            PodsMut::InPlace(v) => v,
            PodsMut::Copied(v, _) => v,
        }
    }

    pub(crate) fn finish(self) {
        if let PodsMut::Copied(v, bytes) = self {
            bytes.copy_from_slice(bytemuck::cast_slice(&v));
        }
    }
}
