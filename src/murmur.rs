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

/// MurmurHash3_x86_128's four 32-bit lanes: the key multipliers (lane
/// `i` multiplies by `C[i]`, then after its rotation by `C[i + 1]`), the
/// key and state rotations, and the state addends.
const X86_128_C: [u32; 4] = [0x239b_961b, 0xab0e_9789, 0x38b3_4ae5, 0xa1e3_8b93];
const X86_128_KEY_ROTATE: [u32; 4] = [15, 16, 17, 18];
const X86_128_STATE_ROTATE: [u32; 4] = [19, 17, 15, 13];
const X86_128_STATE_ADD: [u32; 4] = [0x561c_cd1b, 0x0bca_a747, 0x96cd_1c35, 0x32ac_3b17];

/// Lane `lane`'s mix of one key word (a block word or a tail word).
#[inline]
fn x86_128_key(k: u32, lane: usize) -> u32 {
    k.wrapping_mul(X86_128_C[lane])
        .rotate_left(X86_128_KEY_ROTATE[lane])
        .wrapping_mul(X86_128_C[(lane + 1) % 4])
}

/// Mix one 16-byte block into the state. Lanes go in order, each adding
/// the next lane's state: lanes 1 to 3 the old one, lane 4 the new lane 1.
#[inline]
fn x86_128_block(h: &mut [u32; 4], block: &[u8]) {
    for lane in 0..4 {
        h[lane] ^= x86_128_key(word(&block[lane * 4..]), lane);
        h[lane] = h[lane]
            .rotate_left(X86_128_STATE_ROTATE[lane])
            .wrapping_add(h[(lane + 1) % 4])
            .wrapping_mul(5)
            .wrapping_add(X86_128_STATE_ADD[lane]);
    }
}

/// Mix the last 0 to 15 bytes: each lane with bytes in the tail takes its
/// (up to) four as a little-endian word.
#[inline]
fn x86_128_tail(h: &mut [u32; 4], tail: &[u8]) {
    for (lane, part) in tail.chunks(4).enumerate() {
        h[lane] ^= x86_128_key(tail_word(part), lane);
    }
}

/// Lane 1 takes the sum of all four, then every other lane adds it.
#[inline]
fn x86_128_add_lanes(h: &mut [u32; 4]) {
    let sum = h[0]
        .wrapping_add(h[1])
        .wrapping_add(h[2])
        .wrapping_add(h[3]);
    h[0] = sum;
    for lane in &mut h[1..] {
        *lane = lane.wrapping_add(sum);
    }
}

/// The finalisation: the length, lane sums around `fmix32`, and the two
/// 64-bit halves (lanes 1 and 2, then 3 and 4, low lane first).
fn x86_128_finish(mut h: [u32; 4], len: u32) -> [u64; 2] {
    for lane in &mut h {
        *lane ^= len;
    }
    x86_128_add_lanes(&mut h);
    for lane in &mut h {
        *lane = fmix32(*lane);
    }
    x86_128_add_lanes(&mut h);
    [
        (h[0] as u64) | ((h[1] as u64) << 32),
        (h[2] as u64) | ((h[3] as u64) << 32),
    ]
}

/// MurmurHash3_x86_128, returned as its two little-endian 64-bit halves.
pub fn murmur3_x86_128(data: &[u8], seed: u32) -> [u64; 2] {
    let mut h = [seed; 4];
    let mut blocks = data.chunks_exact(16);
    for block in &mut blocks {
        x86_128_block(&mut h, block);
    }
    x86_128_tail(&mut h, blocks.remainder());
    x86_128_finish(h, data.len() as u32)
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

    #[test]
    fn x86_128_vectors_of_every_tail_length() {
        // Python mmh3 5.x, `hash128(data, seed, x64arch=False)` split into
        // its low and high 64 bits: prefixes of one sentence whose lengths
        // leave a tail in each lane (1 to 15 bytes) or none (16, 32).
        let fox = b"The quick brown fox jumps over the lazy dog";
        let table: &[(usize, u32, [u64; 2])] = &[
            (1, 0, [0xd32c_ba11_3126_58d4, 0xd32c_ba11_d32c_ba11]),
            (
                3,
                0x9747_b28c,
                [0x1a09_d4aa_8faa_c277, 0x1a09_d4aa_1a09_d4aa],
            ),
            (4, 1, [0xed74_0d3e_f55c_2f0e, 0xed74_0d3e_ed74_0d3e]),
            (
                7,
                0x9747_b28c,
                [0x8379_bd23_21a4_e137, 0xf858_a156_f858_a156],
            ),
            (8, 0, [0xc96f_1f6d_66b6_c80a, 0x6d8a_0980_6d8a_0980]),
            (
                11,
                0xffff_ffff,
                [0x0c11_b4e1_c7d7_7b99, 0xd7c0_a57a_f4fc_fd4b],
            ),
            (
                12,
                0x9747_b28c,
                [0x5c40_be80_5d59_2803, 0x9be8_cd8e_4e3a_da6f],
            ),
            (15, 2, [0x728b_b88e_ab6b_bbf8, 0x648d_5852_add3_e9e6]),
            (16, 0, [0x85dc_9f00_05af_2e98, 0x1005_cf2a_7a56_0e93]),
            (
                32,
                0x9747_b28c,
                [0xaeca_b2d2_e894_5ecc, 0xe360_e9a9_a148_c806],
            ),
            (
                43,
                0x9747_b28c,
                [0x4cb8_6171_8ad4_d55e, 0xcdb6_793e_8ea7_3a9c],
            ),
        ];
        for &(len, seed, want) in table {
            let data = &fox[..len];
            assert_eq!(murmur3_x86_128(data, seed), want, "{data:?} seed {seed:#x}");
        }
    }
}
