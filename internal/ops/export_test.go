package ops

// Version is relayVersion, for the tests of package ops_test.
var Version = relayVersion
