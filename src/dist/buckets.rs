//! How the parameters are cut for the exchange: all parameters laid end to end in backward order
//! (the last parameter first: its gradient is complete first), cut into buckets of at most
//! `bucket_values`; each bucket is padded to a multiple of N and split into N equal chunks, and
//! rank r owns chunk r of every bucket (its shard). A shard is described by [`Piece`]s — a
//! parameter and a range of its elements — which do not depend on N or the bucket size, so a
//! checkpoint written by N ranks can be read by any other number.

use crate::error::{Error, Result};

/// A contiguous range of one parameter's elements.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Piece {
    /// Index of the parameter in `Module::params` order.
    pub param: usize,
    /// First element and element count within the parameter.
    pub offset: usize,
    pub len: usize,
    /// Where the piece starts within its bucket.
    pub at: usize,
}

/// One bucket: the pieces it holds (every rank's), its unpadded length and its chunk length.
#[derive(Clone, Debug)]
pub struct Bucket {
    pub pieces: Vec<Piece>,
    pub len: usize,
    pub chunk: usize,
}

impl Bucket {
    /// The parameters with elements in this bucket.
    pub fn params(&self) -> Vec<usize> {
        let mut p: Vec<usize> = self.pieces.iter().map(|p| p.param).collect();
        p.dedup();
        p
    }

    /// The pieces of `rank`'s chunk, with `at` relative to the chunk's start.
    pub fn owned(&self, rank: usize) -> Vec<Piece> {
        let (lo, hi) = (rank * self.chunk, ((rank + 1) * self.chunk).min(self.len));
        self.pieces
            .iter()
            .filter_map(|p| {
                let (s, e) = (p.at.max(lo), (p.at + p.len).min(hi));
                (s < e).then(|| Piece { param: p.param, offset: p.offset + (s - p.at), len: e - s, at: s - lo })
            })
            .collect()
    }
}

/// The buckets of a run and this rank's shard of them.
#[derive(Clone, Debug)]
pub struct ShardLayout {
    pub ranks: usize,
    pub rank: usize,
    pub buckets: Vec<Bucket>,
    /// This rank's pieces, bucket by bucket (`owned[b]`), in shard order.
    pub owned: Vec<Vec<Piece>>,
}

impl ShardLayout {
    /// `sizes[i]`: elements of parameter i; `bucket_values`: most values in a bucket.
    pub fn new(sizes: &[usize], ranks: usize, rank: usize, bucket_values: usize) -> Result<ShardLayout> {
        if ranks == 0 || rank >= ranks || bucket_values == 0 {
            return Err(Error::invalid(
                "shard layout",
                format!("rank {rank} of {ranks} with buckets of {bucket_values} values"),
            ));
        }
        let mut buckets = Vec::new();
        let mut cur = Bucket { pieces: Vec::new(), len: 0, chunk: 0 };
        for (param, &n) in sizes.iter().enumerate().rev() {
            let mut offset = 0;
            while offset < n {
                let take = (n - offset).min(bucket_values - cur.len);
                cur.pieces.push(Piece { param, offset, len: take, at: cur.len });
                cur.len += take;
                offset += take;
                if cur.len == bucket_values {
                    buckets.push(std::mem::replace(&mut cur, Bucket { pieces: Vec::new(), len: 0, chunk: 0 }));
                }
            }
        }
        if cur.len > 0 {
            buckets.push(cur);
        }
        for b in &mut buckets {
            b.chunk = b.len.div_ceil(ranks);
        }
        let owned = buckets.iter().map(|b| b.owned(rank)).collect();
        Ok(ShardLayout { ranks, rank, buckets, owned })
    }

    /// Elements this rank owns (its moments' length).
    pub fn shard_len(&self) -> usize {
        self.owned.iter().flatten().map(|p| p.len).sum()
    }

    /// Chunk length of each bucket.
    pub fn chunks(&self) -> Vec<usize> {
        self.buckets.iter().map(|b| b.chunk).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every element of every parameter is owned by exactly one rank, whatever N and bucket size.
    #[test]
    fn shards_cover_every_element_once() {
        let sizes = [7, 1, 130, 64, 3];
        for ranks in 1..=5 {
            for bucket in [1, 5, 64, 1000] {
                let mut seen: Vec<Vec<u32>> = sizes.iter().map(|&n| vec![0; n]).collect();
                let mut total = 0;
                for rank in 0..ranks {
                    let l = ShardLayout::new(&sizes, ranks, rank, bucket).unwrap();
                    for (b, pieces) in l.buckets.iter().zip(&l.owned) {
                        assert!(b.len <= bucket && b.chunk * ranks >= b.len);
                        for p in pieces {
                            assert!(p.at + p.len <= b.chunk);
                            for e in &mut seen[p.param][p.offset..p.offset + p.len] {
                                *e += 1;
                            }
                        }
                    }
                    total += l.shard_len();
                }
                assert_eq!(total, sizes.iter().sum::<usize>(), "ranks {ranks}, bucket {bucket}");
                assert!(seen.iter().flatten().all(|&c| c == 1), "ranks {ranks}, bucket {bucket}: {seen:?}");
            }
        }
    }

    #[test]
    fn last_parameter_comes_first() {
        let l = ShardLayout::new(&[4, 4], 2, 0, 100).unwrap();
        assert_eq!(l.buckets[0].pieces[0].param, 1);
        assert_eq!(l.owned[0], vec![Piece { param: 1, offset: 0, len: 4, at: 0 }]);
        assert!(ShardLayout::new(&[4], 2, 2, 100).is_err());
    }
}
