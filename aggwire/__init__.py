"""The aggregation wire protocol: constants, the Scapy layer and the vectorized packer."""
