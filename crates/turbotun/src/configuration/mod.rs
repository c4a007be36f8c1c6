//! Configuration through rtnetlink (addresses, routes, MTU, state, bridges, VXLAN) and network namespaces.

pub mod netlink;
pub mod netns;
