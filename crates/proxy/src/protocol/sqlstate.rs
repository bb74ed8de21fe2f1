//! SQLSTATE codes weir sends itself, as named constants.

/// A five-character SQLSTATE code.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SqlState(pub &'static str);

impl SqlState {
    pub const fn code(&self) -> &'static str {
        self.0
    }
}

pub const CONNECTION_EXCEPTION: SqlState = SqlState("08000");
pub const CONNECTION_FAILURE: SqlState = SqlState("08006");
pub const SQLCLIENT_UNABLE_TO_ESTABLISH_SQLCONNECTION: SqlState = SqlState("08001");
pub const PROTOCOL_VIOLATION: SqlState = SqlState("08P01");
pub const FEATURE_NOT_SUPPORTED: SqlState = SqlState("0A000");
pub const INVALID_AUTHORIZATION_SPECIFICATION: SqlState = SqlState("28000");
pub const INVALID_PASSWORD: SqlState = SqlState("28P01");
pub const INVALID_CATALOG_NAME: SqlState = SqlState("3D000");
pub const TOO_MANY_CONNECTIONS: SqlState = SqlState("53300");
pub const WARNING: SqlState = SqlState("01000");
pub const IN_FAILED_SQL_TRANSACTION: SqlState = SqlState("25P02");
/// A BEGIN inside a transaction (a WARNING).
pub const ACTIVE_SQL_TRANSACTION: SqlState = SqlState("25001");
/// A write refused by a read-only transaction (a standby, or
/// default_transaction_read_only).
pub const READ_ONLY_SQL_TRANSACTION: SqlState = SqlState("25006");
pub const INVALID_SQL_STATEMENT_NAME: SqlState = SqlState("26000");
pub const DUPLICATE_PREPARED_STATEMENT: SqlState = SqlState("42P05");
pub const QUERY_CANCELED: SqlState = SqlState("57014");
/// A deadlock Postgres broke by failing one of its transactions.
pub const DEADLOCK_DETECTED: SqlState = SqlState("40P01");
pub const ADMIN_SHUTDOWN: SqlState = SqlState("57P01");
pub const CANNOT_CONNECT_NOW: SqlState = SqlState("57P03");
pub const INVALID_PARAMETER_VALUE: SqlState = SqlState("22023");
pub const SYNTAX_ERROR: SqlState = SqlState("42601");
pub const PROGRAM_LIMIT_EXCEEDED: SqlState = SqlState("54000");
pub const INTERNAL_ERROR: SqlState = SqlState("XX000");
pub const IDLE_IN_TRANSACTION_SESSION_TIMEOUT: SqlState = SqlState("25P03");
/// Postgres 17's transaction_timeout.
pub const TRANSACTION_TIMEOUT: SqlState = SqlState("25P04");
pub const INSUFFICIENT_PRIVILEGE: SqlState = SqlState("42501");
pub const UNDEFINED_OBJECT: SqlState = SqlState("42704");
pub const CANT_CHANGE_RUNTIME_PARAM: SqlState = SqlState("55P02");
pub const OBJECT_NOT_IN_PREREQUISITE_STATE: SqlState = SqlState("55000");
pub const CONFIG_FILE_ERROR: SqlState = SqlState("F0000");
/// The code of a plain NoticeResponse.
pub const SUCCESSFUL_COMPLETION: SqlState = SqlState("00000");

/// The errors counted apart per statement fingerprint (SHOW QUERIES), in
/// the order of their bits in `counted_error_bit`.
pub const COUNTED_ERRORS: [SqlState; 3] = [QUERY_CANCELED, IN_FAILED_SQL_TRANSACTION, DEADLOCK_DETECTED];

/// The bit an error's SQLSTATE sets among the errors a transaction met:
/// one per `COUNTED_ERRORS` entry, and the next for any other code.
pub fn counted_error_bit(code: &[u8]) -> u8 {
    let i = COUNTED_ERRORS.iter().position(|c| c.code().as_bytes() == code).unwrap_or(COUNTED_ERRORS.len());
    1 << i
}

/// Every code above, for mapping a code a server sent onto a constant.
const ALL: &[SqlState] = &[
    CONNECTION_EXCEPTION,
    CONNECTION_FAILURE,
    SQLCLIENT_UNABLE_TO_ESTABLISH_SQLCONNECTION,
    PROTOCOL_VIOLATION,
    FEATURE_NOT_SUPPORTED,
    INVALID_AUTHORIZATION_SPECIFICATION,
    INVALID_PASSWORD,
    INVALID_CATALOG_NAME,
    TOO_MANY_CONNECTIONS,
    QUERY_CANCELED,
    DEADLOCK_DETECTED,
    ADMIN_SHUTDOWN,
    CANNOT_CONNECT_NOW,
    INVALID_PARAMETER_VALUE,
    SYNTAX_ERROR,
    PROGRAM_LIMIT_EXCEEDED,
    INTERNAL_ERROR,
    IDLE_IN_TRANSACTION_SESSION_TIMEOUT,
    TRANSACTION_TIMEOUT,
    INSUFFICIENT_PRIVILEGE,
    UNDEFINED_OBJECT,
    CANT_CHANGE_RUNTIME_PARAM,
    OBJECT_NOT_IN_PREREQUISITE_STATE,
    CONFIG_FILE_ERROR,
    SUCCESSFUL_COMPLETION,
];

/// The named constant for a code a server sent, if weir names it.
pub fn lookup(code: &str) -> Option<SqlState> {
    ALL.iter().copied().find(|s| s.code() == code)
}

#[cfg(test)]
mod tests {
    #[test]
    fn lookup_finds_named_codes_only() {
        assert_eq!(super::lookup("42704"), Some(super::UNDEFINED_OBJECT));
        assert_eq!(super::lookup("99999"), None);
    }
}
