//! Configuration through rtnetlink (addresses, routes, MTU, state, bridges, VXLAN) and network namespaces, and the
//! rule for the paths of the Unix sockets turbotun binds.

pub mod local_socket;
pub mod netlink;
pub mod netns;
