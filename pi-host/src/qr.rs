//! `pi-host pair --qr`: the pairing link as a QR code a phone can read off an 80×24 terminal
//! (deploy/README.md, "The host's own CLI").
//!
//! The smallest error correction (L: the screen is not a dirty label) keeps the code small: a
//! pairing link of up to 154 bytes, which an address (`NAME:PORT`) of up to 24 characters
//! makes, is a version 7 code of 45×45 modules, whatever the token's characters (one byte-mode
//! segment). Two rows of modules go on one line (Unicode half blocks),
//! with one light row above and below and four light columns either side: 24 lines of 53
//! columns. Dark modules are the blocks; the terminal's background is the light.

use qrcode::{Color, EcLevel, QrCode};

/// Lines a terminal shows at once.
pub const TERMINAL_LINES: usize = 24;
/// Light modules left and right (the standard's quiet zone), and above and below (less: a line
/// is two rows, and the terminal's own background surrounds the code anyway).
const SIDE_QUIET: usize = 4;
const END_QUIET: usize = 1;

/// A drawn code: its text (lines ending in `\n`), lines and columns.
#[derive(Debug)]
pub struct Drawn {
    pub text: String,
    pub lines: usize,
    pub columns: usize,
    /// Modules per side (45 for version 7).
    pub modules: usize,
}

/// Draws `link` as a QR code; an error when it cannot be encoded (longer than a QR code holds).
pub fn draw(link: &str) -> Result<Drawn, String> {
    let code = byte_mode(link.as_bytes())
        .ok_or("the link is longer than a QR code holds, so it cannot be drawn")?;
    let modules = code.width();
    let colors = code.to_colors();
    let dark = |x: usize, y: usize| -> bool {
        // Coordinates in the padded picture; outside the code is light.
        let (Some(x), Some(y)) = (x.checked_sub(SIDE_QUIET), y.checked_sub(END_QUIET)) else {
            return false;
        };
        x < modules && y < modules && colors[y * modules + x] == Color::Dark
    };
    let columns = modules + 2 * SIDE_QUIET;
    let rows = modules + 2 * END_QUIET;
    let mut text = String::new();
    for top in (0..rows).step_by(2) {
        for x in 0..columns {
            text.push(match (dark(x, top), dark(x, top + 1)) {
                (true, true) => '█',
                (true, false) => '▀',
                (false, true) => '▄',
                (false, false) => ' ',
            });
        }
        let kept = text.trim_end_matches(' ').len();
        text.truncate(kept);
        text.push('\n');
    }
    Ok(Drawn {
        lines: rows.div_ceil(2),
        columns,
        modules,
        text,
    })
}

/// The smallest code holding `data` as one byte-mode segment. The crate's own choice of
/// segments switches to numeric mode for runs of digits, whose headers can cost more than they
/// save: a link of random hex and base64 then needed a larger version than its length does.
fn byte_mode(data: &[u8]) -> Option<QrCode> {
    (1..=40).find_map(|version| {
        let mut bits = qrcode::bits::Bits::new(qrcode::Version::Normal(version));
        bits.push_byte_data(data).ok()?;
        bits.push_terminator(EcLevel::L).ok()?;
        QrCode::with_bits(bits, EcLevel::L).ok()
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A pairing link as `pi-host pair --address` makes it, with a token as random as a real
    /// one.
    fn link(address: &str) -> String {
        link_with(address, "ppt_q3Zx8LmPa0Tb.Kd9wR2vYh5NcXe1uJf7GsA")
    }

    fn link_with(address: &str, token: &str) -> String {
        racp_server::identity::pairing_link(
            address,
            Some(&"3f9c0e7a5b12d48e".repeat(4).parse().unwrap()),
            true,
            token,
        )
    }

    #[test]
    fn the_size_depends_on_the_link_s_length_not_its_characters() {
        let address = format!("{}:7878", "h".repeat(19));
        for token in [
            "ppt_SpvNljPctr_7.JNhXMHY2-DEDSd2YWXS03g",
            "ppt_123456789012.1234567890123456789012",
            "ppt_a1b2c3d4e5f6.9a8b7c6d5e4f3a2b1c0d9e",
        ] {
            let link = link_with(&address, token);
            assert_eq!(link.len(), 154);
            assert_eq!(draw(&link).unwrap().modules, 45, "{token}");
        }
    }

    #[test]
    fn a_typical_link_fits_an_80_by_24_terminal_up_to_154_bytes() {
        for address in ["192.168.1.20:7878", "devbox.example.net:7878"] {
            let drawn = draw(&link(address)).unwrap();
            assert!(
                drawn.lines <= TERMINAL_LINES && drawn.columns <= 80,
                "{drawn:?}"
            );
        }
        // The bound: 154 bytes is version 7 (45 modules, 24 lines); one more is version 8.
        let at_bound = link(&format!("{}:7878", "h".repeat(19)));
        assert_eq!(at_bound.len(), 154);
        let drawn = draw(&at_bound).unwrap();
        assert_eq!((drawn.modules, drawn.lines, drawn.columns), (45, 24, 53));
        assert_eq!(drawn.text.lines().count(), drawn.lines);
        assert!(drawn.text.lines().all(|l| l.chars().count() <= 80));
        let over = link(&format!("{}:7878", "h".repeat(20)));
        assert_eq!(over.len(), 155);
        let drawn = draw(&over).unwrap();
        assert_eq!(drawn.modules, 49);
        assert!(drawn.lines > TERMINAL_LINES);
    }

    #[test]
    fn the_drawing_is_the_code_s_modules_two_rows_a_line() {
        let code = byte_mode(b"racp").unwrap();
        let drawn = draw("racp").unwrap();
        let lines: Vec<Vec<char>> = drawn.text.lines().map(|l| l.chars().collect()).collect();
        let colors = code.to_colors();
        let modules = code.width();
        for y in 0..modules {
            for x in 0..modules {
                let row = y + END_QUIET;
                let cell = lines[row / 2].get(x + SIDE_QUIET).copied().unwrap_or(' ');
                let dark = match cell {
                    '█' => true,
                    '▀' => row.is_multiple_of(2),
                    '▄' => !row.is_multiple_of(2),
                    _ => false,
                };
                assert_eq!(dark, colors[y * modules + x] == Color::Dark, "({x}, {y})");
            }
        }
    }
}
