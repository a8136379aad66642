//! A secret as a statement's parameter: tokio-postgres logs every statement's parameters
//! with their `Debug` at debug level (`executing statement … with parameters: […]`), and a
//! node's peer key is one of them.

use std::fmt;

use bytes::BytesMut;
use tokio_postgres::types::{IsNull, ToSql, Type};

/// A text parameter whose `Debug` shows no more than that it is hidden.
pub(super) struct Redacted<'a>(pub(super) &'a str);

impl fmt::Debug for Redacted<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("<redacted>")
    }
}

impl ToSql for Redacted<'_> {
    fn to_sql(
        &self,
        ty: &Type,
        out: &mut BytesMut,
    ) -> Result<IsNull, Box<dyn std::error::Error + Sync + Send>> {
        self.0.to_sql(ty, out)
    }

    fn accepts(ty: &Type) -> bool {
        <&str as ToSql>::accepts(ty)
    }

    tokio_postgres::types::to_sql_checked!();
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn its_debug_hides_the_value() {
        assert_eq!(format!("{:?}", Redacted("the-secret")), "<redacted>");
    }
}
