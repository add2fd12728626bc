//! Sans-IO codec for PERSISTENT RESERVE IN/OUT (SPC-4): CDBs, parameter lists, responses.
