//! CRC32C (Castagnoli), the checksum of every log and snapshot record:
//! SSE4.2's `crc32` instruction where the CPU has it (about 8 bytes per
//! cycle), else a byte table. Both give the same value (unit tests).

/// The reflected Castagnoli polynomial.
const POLY: u32 = 0x82F6_3B78;

const fn table() -> [u32; 256] {
    let mut t = [0u32; 256];
    let mut i = 0;
    while i < 256 {
        let mut c = i as u32;
        let mut k = 0;
        while k < 8 {
            c = if c & 1 != 0 { (c >> 1) ^ POLY } else { c >> 1 };
            k += 1;
        }
        t[i] = c;
        i += 1;
    }
    t
}

static TABLE: [u32; 256] = table();

/// CRC32C of `bytes`, continuing from `crc` (0 to start).
pub fn extend(crc: u32, bytes: &[u8]) -> u32 {
    #[cfg(target_arch = "x86_64")]
    {
        if std::arch::is_x86_feature_detected!("sse4.2") {
            // SAFETY: the CPU has SSE4.2 (checked just above).
            return unsafe { extend_sse42(crc, bytes) };
        }
    }
    extend_table(crc, bytes)
}

/// CRC32C of `bytes`.
pub fn of(bytes: &[u8]) -> u32 {
    extend(0, bytes)
}

fn extend_table(crc: u32, bytes: &[u8]) -> u32 {
    let mut c = !crc;
    for &b in bytes {
        c = TABLE[((c ^ b as u32) & 0xff) as usize] ^ (c >> 8);
    }
    !c
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "sse4.2")]
unsafe fn extend_sse42(crc: u32, bytes: &[u8]) -> u32 {
    use std::arch::x86_64::{_mm_crc32_u64, _mm_crc32_u8};
    let mut c = !crc as u64;
    let mut chunks = bytes.chunks_exact(8);
    for chunk in &mut chunks {
        let word = u64::from_le_bytes(chunk.try_into().expect("8 bytes"));
        c = _mm_crc32_u64(c, word);
    }
    let mut c = c as u32;
    for &b in chunks.remainder() {
        c = _mm_crc32_u8(c, b);
    }
    !c
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn known_values() {
        // RFC 3720 (iSCSI) B.4 test vectors, and the common check value.
        assert_eq!(of(b"123456789"), 0xE306_9283);
        assert_eq!(of(&[0u8; 32]), 0x8A91_36AA);
        assert_eq!(of(&[0xffu8; 32]), 0x62A8_AB43);
        let ascending: Vec<u8> = (0..32).collect();
        assert_eq!(of(&ascending), 0x46DD_794E);
    }

    #[test]
    fn hardware_and_table_agree_and_extend_composes() {
        let data: Vec<u8> = (0..1000u32).map(|i| (i * 7 + 3) as u8).collect();
        for len in [0, 1, 7, 8, 9, 63, 64, 65, 999, 1000] {
            assert_eq!(extend(0, &data[..len]), extend_table(0, &data[..len]));
        }
        let (a, b) = data.split_at(333);
        assert_eq!(extend(extend(0, a), b), of(&data));
    }
}
