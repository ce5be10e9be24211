"""What the cache is worth: GPU time saved per tier, the marginal value of capacity, and, with prices, cost."""
