//! Glob-style matching with Redis' semantics (`KEYS`, `SCAN MATCH`,
//! `CONFIG GET`): `*`, `?`, `[abc]`, `[^a]`, `[a-z]`, and `\` escapes.
//!
//! Iterative with single-star backtracking, so a hostile pattern such as
//! `a*a*a*a*...b` costs O(pattern × key), never exponential time.

/// Does `key` match `pattern`?
pub fn matches(pattern: &[u8], key: &[u8]) -> bool {
    let (mut p, mut k) = (0usize, 0usize);
    // Where to resume after the last '*': pattern index after it, key index.
    let mut star: Option<(usize, usize)> = None;
    while k < key.len() {
        if p < pattern.len() {
            match pattern[p] {
                b'*' => {
                    // Collapse runs of stars.
                    while p < pattern.len() && pattern[p] == b'*' {
                        p += 1;
                    }
                    if p == pattern.len() {
                        return true;
                    }
                    star = Some((p, k));
                    continue;
                }
                _ => {
                    if let Some(used) = match_one(&pattern[p..], key[k]) {
                        p += used;
                        k += 1;
                        continue;
                    }
                }
            }
        }
        match star {
            Some((sp, sk)) => {
                p = sp;
                k = sk + 1;
                star = Some((sp, sk + 1));
            }
            None => return false,
        }
    }
    pattern[p..].iter().all(|&c| c == b'*')
}

/// Matches one key byte against the pattern element at the start of `pat`
/// (which is not `*`); returns how many pattern bytes the element used.
fn match_one(pat: &[u8], c: u8) -> Option<usize> {
    match pat[0] {
        b'?' => Some(1),
        b'\\' if pat.len() >= 2 => (pat[1] == c).then_some(2),
        b'[' => match_class(pat, c),
        other => (other == c).then_some(1),
    }
}

fn match_class(pat: &[u8], c: u8) -> Option<usize> {
    let mut i = 1;
    let negate = pat.get(i) == Some(&b'^');
    if negate {
        i += 1;
    }
    let mut hit = false;
    loop {
        match pat.get(i) {
            // Unterminated class: Redis treats the end of pattern as the end.
            None => {
                i -= 1;
                break;
            }
            Some(b']') => break,
            Some(b'\\') if i + 1 < pat.len() => {
                hit |= pat[i + 1] == c;
                i += 2;
            }
            Some(&lo)
                if pat.get(i + 1) == Some(&b'-') && i + 2 < pat.len() && pat[i + 2] != b']' =>
            {
                let hi = pat[i + 2];
                let (lo, hi) = if lo <= hi { (lo, hi) } else { (hi, lo) };
                hit |= (lo..=hi).contains(&c);
                i += 3;
            }
            Some(&x) => {
                hit |= x == c;
                i += 1;
            }
        }
    }
    (hit != negate).then_some(i + 1)
}

#[cfg(test)]
mod tests {
    use super::matches;

    #[test]
    fn redis_examples() {
        let yes = [
            ("*", ""),
            ("*", "abc"),
            ("h?llo", "hello"),
            ("h*llo", "heeeello"),
            ("h[ae]llo", "hallo"),
            ("h[^e]llo", "hallo"),
            ("h[a-b]llo", "hbllo"),
            ("h[b-a]llo", "hallo"),
            ("\\*", "*"),
            ("a\\?c", "a?c"),
            ("user:*:name", "user:42:name"),
            ("**a**", "xxa"),
        ];
        let no = [
            ("h?llo", "hllo"),
            ("h[ae]llo", "hillo"),
            ("h[^e]llo", "hello"),
            ("h[a-b]llo", "hcllo"),
            ("\\*", "a"),
            ("a", "ab"),
            ("ab", "a"),
            ("user:*:name", "user:42:age"),
        ];
        for (p, k) in yes {
            assert!(matches(p.as_bytes(), k.as_bytes()), "{p} ~ {k}");
        }
        for (p, k) in no {
            assert!(!matches(p.as_bytes(), k.as_bytes()), "{p} !~ {k}");
        }
    }

    #[test]
    fn hostile_pattern_is_fast() {
        let pat = "a*".repeat(200) + "b";
        let key = "a".repeat(5000);
        assert!(!matches(pat.as_bytes(), key.as_bytes()));
    }

    #[test]
    fn binary_keys() {
        assert!(matches(b"\xff*", b"\xff\x00\x01"));
        assert!(matches(b"[\x00-\x05]", b"\x03"));
    }
}
