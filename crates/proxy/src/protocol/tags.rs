//! Message tags of the PostgreSQL v3 protocol, as named `u8` constants.
//!
//! Frontend (client to server) and backend (server to client) share some
//! letters with different meanings, so they live in separate modules.

/// Tags of messages a client sends.
pub mod frontend {
    pub const BIND: u8 = b'B';
    pub const CLOSE: u8 = b'C';
    pub const COPY_DATA: u8 = b'd';
    pub const COPY_DONE: u8 = b'c';
    pub const COPY_FAIL: u8 = b'f';
    pub const DESCRIBE: u8 = b'D';
    pub const EXECUTE: u8 = b'E';
    pub const FLUSH: u8 = b'H';
    pub const FUNCTION_CALL: u8 = b'F';
    pub const PARSE: u8 = b'P';
    /// PasswordMessage, SASLInitialResponse and SASLResponse share this tag.
    pub const PASSWORD: u8 = b'p';
    pub const QUERY: u8 = b'Q';
    pub const SYNC: u8 = b'S';
    pub const TERMINATE: u8 = b'X';
}

/// Tags of messages a server sends.
pub mod backend {
    pub const AUTHENTICATION: u8 = b'R';
    pub const BACKEND_KEY_DATA: u8 = b'K';
    pub const BIND_COMPLETE: u8 = b'2';
    pub const CLOSE_COMPLETE: u8 = b'3';
    pub const COMMAND_COMPLETE: u8 = b'C';
    pub const COPY_BOTH_RESPONSE: u8 = b'W';
    pub const COPY_DATA: u8 = b'd';
    pub const COPY_DONE: u8 = b'c';
    pub const COPY_IN_RESPONSE: u8 = b'G';
    pub const COPY_OUT_RESPONSE: u8 = b'H';
    pub const DATA_ROW: u8 = b'D';
    pub const EMPTY_QUERY_RESPONSE: u8 = b'I';
    pub const ERROR_RESPONSE: u8 = b'E';
    pub const FUNCTION_CALL_RESPONSE: u8 = b'V';
    pub const NEGOTIATE_PROTOCOL_VERSION: u8 = b'v';
    pub const NO_DATA: u8 = b'n';
    pub const NOTICE_RESPONSE: u8 = b'N';
    pub const NOTIFICATION_RESPONSE: u8 = b'A';
    pub const PARAMETER_DESCRIPTION: u8 = b't';
    pub const PARAMETER_STATUS: u8 = b'S';
    pub const PARSE_COMPLETE: u8 = b'1';
    pub const PORTAL_SUSPENDED: u8 = b's';
    pub const READY_FOR_QUERY: u8 = b'Z';
    pub const ROW_DESCRIPTION: u8 = b'T';
}

/// Transaction status bytes carried by ReadyForQuery.
pub mod status {
    pub const IDLE: u8 = b'I';
    pub const IN_TRANSACTION: u8 = b'T';
    pub const FAILED: u8 = b'E';
}

/// Authentication request codes inside an `R` message.
pub mod auth {
    pub const OK: i32 = 0;
    pub const CLEARTEXT_PASSWORD: i32 = 3;
    pub const MD5_PASSWORD: i32 = 5;
    pub const SASL: i32 = 10;
    pub const SASL_CONTINUE: i32 = 11;
    pub const SASL_FINAL: i32 = 12;
}

/// Codes that stand where a protocol version stands in an untagged startup packet.
pub mod startup {
    pub const PROTOCOL_3_0: i32 = 196_608;
    pub const PROTOCOL_3_2: i32 = 196_610;
    pub const CANCEL_REQUEST: i32 = 80_877_102;
    pub const SSL_REQUEST: i32 = 80_877_103;
    pub const GSSENC_REQUEST: i32 = 80_877_104;
}
