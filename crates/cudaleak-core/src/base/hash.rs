//! One hasher for the maps keyed by numbers the process already spread:
//! addresses, trace ids, digests. It stands here, below every floor that
//! keys a map with it.

use std::hash::{BuildHasher, Hasher};

/// Hashes addresses, ids and digests by one mix each. Device pointers are
/// 256- or 512-byte aligned, so the low bits carry nothing; the murmur3
/// finalizer spreads every input bit. The live map, the depot, the frame
/// table, grouping and the timeline key their maps with it (SipHash over
/// a million keys was a tenth of a large exit report; docs/decisions.md,
/// "Hash maps keyed by one multiply-mix, not SipHash").
#[derive(Clone, Copy, Default)]
pub struct AddrHash;

pub struct AddrHasher(u64);

impl BuildHasher for AddrHash {
    type Hasher = AddrHasher;
    fn build_hasher(&self) -> AddrHasher {
        AddrHasher(0)
    }
}

#[inline]
pub fn mix64(mut x: u64) -> u64 {
    x ^= x >> 33;
    x = x.wrapping_mul(0xff51_afd7_ed55_8ccd);
    x ^= x >> 33;
    x = x.wrapping_mul(0xc4ce_b9fe_1a85_ec53);
    x ^= x >> 33;
    x
}

impl Hasher for AddrHasher {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        for chunk in bytes.chunks(8) {
            let mut w = [0u8; 8];
            w[..chunk.len()].copy_from_slice(chunk);
            self.write_u64(u64::from_le_bytes(w));
        }
    }
    #[inline]
    fn write_u64(&mut self, x: u64) {
        self.0 = mix64(self.0 ^ x);
    }
    /// Trace ids (`TraceId` hashes as a `u32`): the timeline's maps by call
    /// site take one mix, not the byte loop.
    #[inline]
    fn write_u32(&mut self, x: u32) {
        self.write_u64(u64::from(x));
    }
    /// Group digests (`KeyDigest` hashes as a `u128`, a hash already).
    #[inline]
    fn write_u128(&mut self, x: u128) {
        self.write_u64(x as u64 ^ (x >> 64) as u64);
    }
}
