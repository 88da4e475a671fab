//! The enums whose values the file stores as text — kinds, states, reasons,
//! counter names — with one shape: `as_str` (the text stored and shown),
//! `FromStr` (an [`crate::Error::Invalid`] naming the values it knows),
//! `Display`, and serde as the same text.

/// An enum of unit variants stored as text. Closed: the schema's `CHECK`
/// constraints, or the engine alone, decide its values.
macro_rules! text_enum {
    (
        $(#[$meta:meta])*
        $vis:vis enum $name:ident ($what:literal) {
            $( $(#[$vmeta:meta])* $variant:ident = $text:literal, )+
        }
    ) => {
        $(#[$meta])*
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
        $vis enum $name {
            $( $(#[$vmeta])* $variant, )+
        }

        impl $name {
            /// Every value, in order.
            pub const ALL: &'static [$name] = &[$($name::$variant,)+];

            /// The value as stored and shown.
            pub fn as_str(self) -> &'static str {
                match self {
                    $( $name::$variant => $text, )+
                }
            }
        }

        impl std::str::FromStr for $name {
            type Err = crate::base::error::Error;

            fn from_str(s: &str) -> std::result::Result<Self, Self::Err> {
                match s {
                    $( $text => Ok($name::$variant), )+
                    other => Err(crate::base::error::Error::invalid(
                        $what,
                        format!("{other:?}; one of {}", [$($text),+].join(", ")),
                    )),
                }
            }
        }

        impl std::fmt::Display for $name {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str(self.as_str())
            }
        }

        impl serde::Serialize for $name {
            fn serialize<S: serde::Serializer>(&self, s: S) -> std::result::Result<S::Ok, S::Error> {
                s.serialize_str(self.as_str())
            }
        }
    };
}

/// An enum stored as text that later versions may extend without a new
/// schema: a value this version does not know reads as `Other(text)`.
macro_rules! open_text_enum {
    (
        $(#[$meta:meta])*
        $vis:vis enum $name:ident {
            $( $(#[$vmeta:meta])* $variant:ident = $text:literal, )+
        }
    ) => {
        $(#[$meta])*
        #[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
        #[non_exhaustive]
        $vis enum $name {
            $( $(#[$vmeta])* $variant, )+
            /// A value written by another version of reflexr.
            Other(String),
        }

        impl $name {
            /// The values this version knows, in order.
            pub const KNOWN: &'static [&'static str] = &[$($text,)+];

            /// The value as stored and shown.
            pub fn as_str(&self) -> &str {
                match self {
                    $( $name::$variant => $text, )+
                    $name::Other(s) => s,
                }
            }

            /// The value stored as `s` (`Other` when this version does not
            /// know it).
            pub fn from_stored(s: &str) -> $name {
                match s {
                    $( $text => $name::$variant, )+
                    other => $name::Other(other.to_string()),
                }
            }
        }

        impl std::fmt::Display for $name {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str(self.as_str())
            }
        }

        impl serde::Serialize for $name {
            fn serialize<S: serde::Serializer>(&self, s: S) -> std::result::Result<S::Ok, S::Error> {
                s.serialize_str(self.as_str())
            }
        }
    };
}

pub(crate) use {open_text_enum, text_enum};

/// [`raw_json`] for a column that may be empty.
pub(crate) fn raw_json_opt<S: serde::Serializer>(
    text: &Option<String>,
    s: S,
) -> Result<S::Ok, S::Error> {
    match text {
        Some(t) => raw_json(t, s),
        None => s.serialize_none(),
    }
}

/// Serialises JSON text the file holds (a payload, an input) as the JSON it
/// is, not as a string; text that is not JSON (it cannot be, the schema
/// checks it) would go as a string.
pub(crate) fn raw_json<S: serde::Serializer>(text: &str, s: S) -> Result<S::Ok, S::Error> {
    use serde::Serialize;
    match serde_json::from_str::<&serde_json::value::RawValue>(text) {
        Ok(raw) => raw.serialize(s),
        Err(_) => text.serialize(s),
    }
}
