"""Write node: follows an execution client and emits each block as
BlockFile / Header / StateDiff / ValidationHash (see docs/vendor-block.md)."""
