//! MurmurHash3 (x86_32 and x86_128), as the reference uses for node hashes,
//! replica ranking and replica bloom filters. Written from the public
//! algorithm description; checked against published vectors below.

#[inline]
fn fmix32(mut h: u32) -> u32 {
    h ^= h >> 16;
    h = h.wrapping_mul(0x85eb_ca6b);
    h ^= h >> 13;
    h = h.wrapping_mul(0xc2b2_ae35);
    h ^ (h >> 16)
}

#[inline]
fn word(bytes: &[u8]) -> u32 {
    u32::from_le_bytes([bytes[0], bytes[1], bytes[2], bytes[3]])
}

/// Little-endian value of up to four tail bytes.
#[inline]
fn tail_word(bytes: &[u8]) -> u32 {
    bytes
        .iter()
        .rev()
        .fold(0u32, |acc, b| (acc << 8) | *b as u32)
}

/// MurmurHash3_x86_32.
pub fn murmur3_x86_32(data: &[u8], seed: u32) -> u32 {
    const C1: u32 = 0xcc9e_2d51;
    const C2: u32 = 0x1b87_3593;
    let mut h = seed;
    let mut blocks = data.chunks_exact(4);
    for block in &mut blocks {
        let k = word(block)
            .wrapping_mul(C1)
            .rotate_left(15)
            .wrapping_mul(C2);
        h ^= k;
        h = h.rotate_left(13).wrapping_mul(5).wrapping_add(0xe654_6b64);
    }
    let tail = blocks.remainder();
    if !tail.is_empty() {
        h ^= tail_word(tail)
            .wrapping_mul(C1)
            .rotate_left(15)
            .wrapping_mul(C2);
    }
    fmix32(h ^ data.len() as u32)
}

/// MurmurHash3_x86_128, returned as its two little-endian 64-bit halves.
pub fn murmur3_x86_128(data: &[u8], seed: u32) -> [u64; 2] {
    const C1: u32 = 0x239b_961b;
    const C2: u32 = 0xab0e_9789;
    const C3: u32 = 0x38b3_4ae5;
    const C4: u32 = 0xa1e3_8b93;
    let (mut h1, mut h2, mut h3, mut h4) = (seed, seed, seed, seed);
    let mut blocks = data.chunks_exact(16);
    for b in &mut blocks {
        let k1 = word(&b[0..4])
            .wrapping_mul(C1)
            .rotate_left(15)
            .wrapping_mul(C2);
        h1 ^= k1;
        h1 = h1
            .rotate_left(19)
            .wrapping_add(h2)
            .wrapping_mul(5)
            .wrapping_add(0x561c_cd1b);
        let k2 = word(&b[4..8])
            .wrapping_mul(C2)
            .rotate_left(16)
            .wrapping_mul(C3);
        h2 ^= k2;
        h2 = h2
            .rotate_left(17)
            .wrapping_add(h3)
            .wrapping_mul(5)
            .wrapping_add(0x0bca_a747);
        let k3 = word(&b[8..12])
            .wrapping_mul(C3)
            .rotate_left(17)
            .wrapping_mul(C4);
        h3 ^= k3;
        h3 = h3
            .rotate_left(15)
            .wrapping_add(h4)
            .wrapping_mul(5)
            .wrapping_add(0x96cd_1c35);
        let k4 = word(&b[12..16])
            .wrapping_mul(C4)
            .rotate_left(18)
            .wrapping_mul(C1);
        h4 ^= k4;
        h4 = h4
            .rotate_left(13)
            .wrapping_add(h1)
            .wrapping_mul(5)
            .wrapping_add(0x32ac_3b17);
    }
    let tail = blocks.remainder();
    let part = |i: usize| -> &[u8] {
        let lo = (i * 4).min(tail.len());
        let hi = (i * 4 + 4).min(tail.len());
        &tail[lo..hi]
    };
    if tail.len() > 12 {
        h4 ^= tail_word(part(3))
            .wrapping_mul(C4)
            .rotate_left(18)
            .wrapping_mul(C1);
    }
    if tail.len() > 8 {
        h3 ^= tail_word(part(2))
            .wrapping_mul(C3)
            .rotate_left(17)
            .wrapping_mul(C4);
    }
    if tail.len() > 4 {
        h2 ^= tail_word(part(1))
            .wrapping_mul(C2)
            .rotate_left(16)
            .wrapping_mul(C3);
    }
    if !tail.is_empty() {
        h1 ^= tail_word(part(0))
            .wrapping_mul(C1)
            .rotate_left(15)
            .wrapping_mul(C2);
    }
    let len = data.len() as u32;
    h1 ^= len;
    h2 ^= len;
    h3 ^= len;
    h4 ^= len;
    h1 = h1.wrapping_add(h2).wrapping_add(h3).wrapping_add(h4);
    h2 = h2.wrapping_add(h1);
    h3 = h3.wrapping_add(h1);
    h4 = h4.wrapping_add(h1);
    h1 = fmix32(h1);
    h2 = fmix32(h2);
    h3 = fmix32(h3);
    h4 = fmix32(h4);
    h1 = h1.wrapping_add(h2).wrapping_add(h3).wrapping_add(h4);
    h2 = h2.wrapping_add(h1);
    h3 = h3.wrapping_add(h1);
    h4 = h4.wrapping_add(h1);
    [
        (h1 as u64) | ((h2 as u64) << 32),
        (h3 as u64) | ((h4 as u64) << 32),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn x86_32_vectors() {
        // Published MurmurHash3_x86_32 vectors.
        let table: &[(&[u8], u32, u32)] = &[
            (b"", 0, 0),
            (b"", 1, 0x514e_28b7),
            (b"", 0xffff_ffff, 0x81f1_6f39),
            (b"\0\0\0\0", 0, 0x2362_f9de),
            (b"aaaa", 0x9747_b28c, 0x5a97_808a),
            (b"aaa", 0x9747_b28c, 0x283e_0130),
            (b"aa", 0x9747_b28c, 0x5d21_1726),
            (b"a", 0x9747_b28c, 0x7fa0_9ea6),
            (b"Hello, world!", 0x9747_b28c, 0x2488_4cba),
            (
                b"The quick brown fox jumps over the lazy dog",
                0x9747_b28c,
                0x2fa8_26cd,
            ),
        ];
        for &(data, seed, want) in table {
            assert_eq!(murmur3_x86_32(data, seed), want, "{data:?} seed {seed:#x}");
        }
    }

    #[test]
    fn x86_128_vectors() {
        assert_eq!(murmur3_x86_128(b"", 0), [0, 0]);
        // Reference values from the Python mmh3 package (x64arch=False).
        let table: &[(&[u8], u32, [u64; 2])] = &[
            (
                b"Hello, world!",
                123,
                [0x5a1a_acd7_61c9_129e, 0x9e37_c886_a416_2162],
            ),
            (
                b"127.0.0.1:7253",
                0,
                [0x70f7_30de_8cec_5e57, 0xceca_4511_211d_c7a4],
            ),
            (
                b"abcdefghijklmnopq",
                5,
                [0x792d_66dd_6374_a78b, 0x6b7b_17e5_04c8_a563],
            ),
        ];
        for &(data, seed, want) in table {
            assert_eq!(murmur3_x86_128(data, seed), want, "{data:?}");
        }
    }
}
