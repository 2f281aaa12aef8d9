//! `leaf_struct!`: declares a parameter struct whose fields are leaves, and its `Tree` impl.

/// Declares `pub struct $name<T = Array>` with required leaves (`T`) followed by optional leaves
/// (`Option<T>`), each with its [`LeafRole`](crate::tree::LeafRole), and implements
/// [`Tree`](crate::tree::Tree) for it with the fields in that order.
macro_rules! leaf_struct {
    (
        $(#[$meta:meta])*
        pub struct $name:ident {
            $( $(#[$leaf_meta:meta])* $leaf:ident: $leaf_role:ident, )*
            $( ? $(#[$opt_meta:meta])* $opt:ident: $opt_role:ident, )*
        }
    ) => {
        $(#[$meta])*
        #[derive(Clone, Debug, PartialEq)]
        pub struct $name<T = mlx_rs::Array> {
            $( $(#[$leaf_meta])* pub $leaf: T, )*
            $( $(#[$opt_meta])* pub $opt: Option<T>, )*
        }

        impl<T> $crate::tree::Tree<T> for $name<T> {
            type Of<U> = $name<U>;

            fn for_each<'a>(&'a self, f: &mut dyn FnMut(&'a T)) {
                $( f(&self.$leaf); )*
                $( if let Some(leaf) = &self.$opt { f(leaf) } )*
            }

            fn for_each_mut(&mut self, f: &mut dyn FnMut(&mut T)) {
                $( f(&mut self.$leaf); )*
                $( if let Some(leaf) = &mut self.$opt { f(leaf) } )*
            }

            fn map<U>(&self, f: &mut dyn FnMut(&T) -> U) -> $name<U> {
                $name {
                    $( $leaf: f(&self.$leaf), )*
                    $( $opt: self.$opt.as_ref().map(|leaf| f(leaf)), )*
                }
            }

            fn map_same(&self, f: &mut dyn FnMut(&T) -> T) -> Self {
                self.map(f)
            }

            fn describe(&self, scope: &$crate::tree::Scope, out: &mut Vec<$crate::tree::LeafSpec>) {
                $(
                    scope.leaf(stringify!($leaf), $crate::tree::LeafRole::$leaf_role, Default::default(), out);
                )*
                $(
                    if self.$opt.is_some() {
                        scope.leaf(stringify!($opt), $crate::tree::LeafRole::$opt_role, Default::default(), out);
                    }
                )*
            }
        }
    };
}

pub(crate) use leaf_struct;
