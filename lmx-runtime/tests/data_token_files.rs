//! The memory-mapped token file: round trips, atomic writes, and errors for corrupt files.

use std::path::{Path, PathBuf};

use lmx_runtime::data::rng::SplitMix64;
use lmx_runtime::data::{
    write_token_file, DataError, TokenDtype, TokenFile, TokenFileFault, TokenFileWriter,
    TokenSource,
};

fn scratch(name: &str) -> PathBuf {
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR"))
        .join("data_token_files")
        .join(name);
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

fn random_tokens(seed: u64, count: usize, bound: u32) -> Vec<u32> {
    let mut rng = SplitMix64::new(seed);
    (0..count)
        .map(|_| rng.below(u64::from(bound)) as u32)
        .collect()
}

fn files_in(dir: &Path) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .map(|entry| entry.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    names
}

#[test]
fn round_trips_u16_and_u32() {
    let dir = scratch("round_trip");
    for (dtype, bound) in [
        (TokenDtype::U16, 1 << 16),
        (TokenDtype::U32, i32::MAX as u32 + 1),
    ] {
        let tokens = random_tokens(11, 10_000, bound);
        let path = dir.join(format!("{dtype}.tok"));
        write_token_file(&path, dtype, &tokens).unwrap();

        let file = TokenFile::open(&path).unwrap();
        assert_eq!(file.dtype(), dtype);
        assert_eq!(file.len(), tokens.len());
        assert_eq!(file.path(), path);
        assert_eq!(file.iter().collect::<Vec<_>>(), tokens);
        assert_eq!(file.get(tokens.len()), None);
        let on_disk = std::fs::metadata(&path).unwrap().len();
        assert_eq!(on_disk as usize, 32 + tokens.len() * dtype.width());

        let mut window = vec![0i32; 100];
        file.read_i32(4321, &mut window).unwrap();
        let expected: Vec<i32> = tokens[4321..4421].iter().map(|&t| t as i32).collect();
        assert_eq!(window, expected);
    }
}

#[test]
fn header_is_little_endian_as_documented() {
    let dir = scratch("layout");
    let path = dir.join("two.tok");
    write_token_file(&path, TokenDtype::U16, &[0x0102, 0xA0B0]).unwrap();
    let bytes = std::fs::read(&path).unwrap();
    assert_eq!(&bytes[0..8], b"LMXTOKEN");
    assert_eq!(u32::from_le_bytes(bytes[8..12].try_into().unwrap()), 1);
    assert_eq!(u32::from_le_bytes(bytes[12..16].try_into().unwrap()), 2);
    assert_eq!(u64::from_le_bytes(bytes[16..24].try_into().unwrap()), 2);
    assert_eq!(&bytes[24..32], &[0; 8]);
    assert_eq!(&bytes[32..], &[0x02, 0x01, 0xB0, 0xA0]);
}

#[test]
fn streaming_writer_and_an_empty_file() {
    let dir = scratch("stream");
    let path = dir.join("chunks.tok");
    let tokens = random_tokens(5, 3000, 50_000);
    let mut writer = TokenFileWriter::create(&path, TokenDtype::U16).unwrap();
    assert!(writer.is_empty());
    for chunk in tokens.chunks(701) {
        writer.push(chunk).unwrap();
    }
    assert_eq!(writer.len(), 3000);
    assert!(!path.exists(), "nothing at the target before finish");
    writer.finish().unwrap();
    assert_eq!(
        TokenFile::open(&path).unwrap().iter().collect::<Vec<_>>(),
        tokens
    );
    assert_eq!(files_in(&dir), ["chunks.tok"], "no temporary file left");

    let empty = dir.join("empty.tok");
    write_token_file(&empty, TokenDtype::U32, &[]).unwrap();
    let file = TokenFile::open(&empty).unwrap();
    assert!(file.is_empty());
}

#[test]
fn dtype_for_vocab() {
    assert_eq!(TokenDtype::for_vocab(256), TokenDtype::U16);
    assert_eq!(TokenDtype::for_vocab(65_536), TokenDtype::U16);
    assert_eq!(TokenDtype::for_vocab(65_537), TokenDtype::U32);
    assert_eq!(TokenDtype::for_vocab(151_936), TokenDtype::U32);
}

#[test]
fn a_failed_or_abandoned_write_leaves_the_previous_file() {
    let dir = scratch("atomic");
    let path = dir.join("corpus.tok");
    write_token_file(&path, TokenDtype::U16, &[1, 2, 3]).unwrap();

    let error = write_token_file(&path, TokenDtype::U16, &[4, 70_000, 6]).unwrap_err();
    assert!(
        matches!(
            error,
            DataError::TokenTooLarge {
                id: 70_000,
                position: 1,
                target: "u16"
            }
        ),
        "{error}"
    );
    assert_eq!(
        TokenFile::open(&path).unwrap().iter().collect::<Vec<_>>(),
        [1, 2, 3]
    );

    let mut abandoned = TokenFileWriter::create(&path, TokenDtype::U16).unwrap();
    abandoned.push(&[9; 1000]).unwrap();
    assert_eq!(
        files_in(&dir).len(),
        2,
        "the temporary file exists meanwhile"
    );
    drop(abandoned);
    assert_eq!(files_in(&dir), ["corpus.tok"]);
    assert_eq!(
        TokenFile::open(&path).unwrap().iter().collect::<Vec<_>>(),
        [1, 2, 3]
    );

    let too_wide = write_token_file(&path, TokenDtype::U32, &[1 << 31]).unwrap_err();
    assert!(matches!(too_wide, DataError::TokenTooLarge { .. }));
}

/// Writes a valid file of 10 u16 tokens, lets `corrupt` change its bytes, and returns the error
/// of opening it.
fn open_corrupted(name: &str, corrupt: impl FnOnce(&mut Vec<u8>)) -> (PathBuf, DataError) {
    let dir = scratch(name);
    let path = dir.join("corpus.tok");
    write_token_file(&path, TokenDtype::U16, &(0..10).collect::<Vec<_>>()).unwrap();
    let mut bytes = std::fs::read(&path).unwrap();
    corrupt(&mut bytes);
    std::fs::write(&path, &bytes).unwrap();
    let error = TokenFile::open(&path).unwrap_err();
    (path, error)
}

fn fault(error: &DataError, path: &Path) -> TokenFileFault {
    match error {
        DataError::TokenFile { path: named, fault } => {
            assert_eq!(named, path);
            assert!(
                error
                    .to_string()
                    .starts_with(&format!("{}: ", path.display())),
                "{error}"
            );
            fault.clone()
        }
        other => panic!("not a token file error: {other}"),
    }
}

#[test]
fn bad_magic_is_named() {
    let (path, error) = open_corrupted("magic", |bytes| bytes[0..8].copy_from_slice(b"GPT2BIN\0"));
    assert!(matches!(
        fault(&error, &path),
        TokenFileFault::BadMagic { .. }
    ));
    let message = error.to_string();
    assert!(message.contains("bad magic"), "{message}");
    assert!(message.contains("not an lmx token file"), "{message}");
}

#[test]
fn truncation_is_named_with_both_lengths() {
    let (path, error) = open_corrupted("truncated", |bytes| bytes.truncate(32 + 2 * 7 + 1));
    assert_eq!(
        fault(&error, &path),
        TokenFileFault::LengthMismatch {
            problem: "truncated",
            count: 10,
            dtype: TokenDtype::U16,
            expected: 52,
            actual: 47,
        }
    );
    assert_eq!(
        error.to_string(),
        format!(
            "{}: truncated: the header says 10 u16 tokens (52 bytes with the header) \
             but the file has 47 bytes",
            path.display()
        )
    );
}

#[test]
fn trailing_bytes_are_named() {
    let (path, error) = open_corrupted("trailing", |bytes| bytes.extend_from_slice(&[0, 0]));
    assert!(matches!(
        fault(&error, &path),
        TokenFileFault::LengthMismatch {
            problem: "trailing bytes",
            actual: 54,
            ..
        }
    ));
}

#[test]
fn a_file_shorter_than_the_header_is_named() {
    let (path, error) = open_corrupted("short", |bytes| bytes.truncate(5));
    assert_eq!(
        fault(&error, &path),
        TokenFileFault::ShortHeader {
            actual: 5,
            header: 32
        }
    );
    assert!(error.to_string().contains("truncated: 5 bytes"), "{error}");
}

#[test]
fn unknown_version_dtype_and_reserved_bytes_are_named() {
    let (path, error) = open_corrupted("version", |bytes| bytes[8] = 9);
    assert_eq!(fault(&error, &path), TokenFileFault::UnsupportedVersion(9));
    let (path, error) = open_corrupted("dtype", |bytes| bytes[12] = 3);
    assert_eq!(fault(&error, &path), TokenFileFault::UnknownDtype(3));
    let (path, error) = open_corrupted("reserved", |bytes| bytes[30] = 1);
    assert_eq!(fault(&error, &path), TokenFileFault::Reserved);
}

#[test]
fn a_missing_file_is_an_io_error_naming_it() {
    let path = scratch("missing").join("absent.tok");
    let error = TokenFile::open(&path).unwrap_err();
    assert!(matches!(&error, DataError::Io { path: named, .. } if *named == path));
    assert!(error.to_string().starts_with(&path.display().to_string()));
}

#[test]
fn an_id_beyond_int32_in_a_hand_made_file_fails_on_read() {
    let dir = scratch("beyond");
    let path = dir.join("wide.tok");
    let mut bytes = Vec::new();
    bytes.extend_from_slice(b"LMXTOKEN");
    bytes.extend_from_slice(&1u32.to_le_bytes());
    bytes.extend_from_slice(&4u32.to_le_bytes());
    bytes.extend_from_slice(&2u64.to_le_bytes());
    bytes.extend_from_slice(&[0; 8]);
    bytes.extend_from_slice(&7u32.to_le_bytes());
    bytes.extend_from_slice(&u32::MAX.to_le_bytes());
    std::fs::write(&path, bytes).unwrap();

    let file = TokenFile::open(&path).unwrap();
    assert_eq!(file.iter().collect::<Vec<_>>(), [7, u32::MAX]);
    let mut out = [0i32; 2];
    let error = file.read_i32(0, &mut out).unwrap_err();
    assert!(matches!(
        error,
        DataError::TokenTooLarge {
            id: u32::MAX,
            position: 1,
            target: "int32"
        }
    ));
}
