"""``mycelia.node``: nodes, contexts, transactions, policy, peering and live queries."""

from mycelia.node.context import Context
from mycelia.node.node import Node
from mycelia.node.policy import Credentials, PeerInfo, PermissiveAgent, PolicyAgent
from mycelia.node.transaction import Transaction

__all__ = [
    "Context",
    "Credentials",
    "Node",
    "PeerInfo",
    "PermissiveAgent",
    "PolicyAgent",
    "Transaction",
]
