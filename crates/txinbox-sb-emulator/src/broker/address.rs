//! Entity paths: splitting a request's entity into queue and sub-queue, and checking a queue path.

use super::{Address, DataError, SubQueue, DEAD_LETTER_SEGMENT};

/// The longest entity path [doc QUOTA].
const MAX_ENTITY_PATH_LEN: usize = 260;

pub(super) fn parse_entity(entity_path: &str) -> Result<Address, DataError> {
    let trimmed = entity_path.trim_matches('/');
    let (queue, sub) = match trimmed.rsplit_once('/') {
        Some((queue, last)) if last.eq_ignore_ascii_case(DEAD_LETTER_SEGMENT) => {
            (queue, SubQueue::DeadLetter)
        }
        _ => (trimmed, SubQueue::Active),
    };
    if queue.is_empty() {
        return Err(DataError::BadRequest(
            "The request URI names no entity.".into(),
        ));
    }
    Ok(Address {
        queue_key: queue.to_ascii_lowercase(),
        location_path: trimmed.to_ascii_lowercase(),
        sub,
    })
}

/// Checks an entity path for the control API: segments of letters, digits, `.`, `-`, `_`, at most
/// 260 characters [doc QUOTA], and no segment the router reserves (`messages`, `$…`).
pub(crate) fn validate_queue_path(path: &str) -> Result<(), String> {
    if path.is_empty() || path.len() > MAX_ENTITY_PATH_LEN {
        return Err(format!(
            "an entity path has 1 to {MAX_ENTITY_PATH_LEN} characters"
        ));
    }
    for segment in path.split('/') {
        if segment.is_empty() {
            return Err("an entity path has no empty segment".into());
        }
        if !segment
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '-' | '_'))
        {
            return Err(format!(
                "segment {segment:?} may hold only letters, digits, '.', '-' and '_'"
            ));
        }
        if segment.eq_ignore_ascii_case("messages") {
            return Err("an entity path may not contain a 'messages' segment".into());
        }
    }
    Ok(())
}
