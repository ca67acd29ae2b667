//! Helpers shared by the integration tests: locating the `metaroce` binary, the test data and the
//! independent tools (scapy in a virtual environment, tshark).
